"""Quality against prompt length (issue 18, part 1): the passkey prompts and the context measure on a tiny model,
the table, the README markdown and the registered claim."""

import math

import pytest
import torch

from swiftkv.measure.longctx import LongContextSettings, long_conversations, measure_long_context, passkey_prompts
from tests.conftest import tiny_base, tiny_conversations, tiny_tokenizer

SMALL = LongContextSettings(lengths=(96, 128), depths=(0.0, 1.0), samples=2, contexts=(8, 32), conversations=3,
                            target_tokens=6)


def test_passkey_prompts_have_their_length_and_the_key_at_its_depth():
    tok = tiny_tokenizer()
    prompts = passkey_prompts(tok, tiny_conversations(60), SMALL)
    assert len(prompts) == 2 * 2 * 2 and {p["tokens"] for p in prompts} == {96, 128}
    from swiftkv.measure.longctx import _chat

    head, _ = _chat(tok)
    unk = tok.unk_token_id  # the needle's words are not in the tiny vocabulary, the filler's are
    for p in prompts:
        first = p["prompt"].index(unk)
        if p["depth"] == 0.0:  # right after the template's head
            assert first == len(head)
        else:  # after all the filler
            assert first > len(head) + 0.8 * (p["length"] - len(head) - 40)
    assert passkey_prompts(tok, tiny_conversations(60), SMALL) == prompts  # seeded: the same prompts every run
    with pytest.raises(Exception, match="too short"):
        passkey_prompts(tok, tiny_conversations(60), LongContextSettings(lengths=(20,), depths=(0.5,), samples=1))


def test_context_measure_scores_the_same_tokens_at_every_length():
    from swiftkv.models.convert import convert_to_swiftkv

    model, tok = tiny_base(), tiny_tokenizer()
    convs = tiny_conversations(60)
    out = measure_long_context(model, tok, convs, SMALL, progress=False)
    assert len(out["passkey"]) == 8 and all(isinstance(p["exact"], bool) for p in out["passkey"])
    assert len(out["context"]) == 3 * 2 and {c["tokens"] for c in out["context"]} == {6}
    # the NLL at the longest context, recomputed with one plain forward over the same tokens
    c = long_conversations(tok, convs, SMALL)[0]["ids"]
    with torch.inference_mode():
        logp = torch.log_softmax(model(torch.tensor([c])).logits[0, :-1].float(), -1)
    want = -sum(logp[i - 1, c[i]].item() for i in range(len(c) - 6, len(c)))
    got = next(r for r in out["context"] if r["context"] == 32)["nll_sum"]
    assert got == pytest.approx(want, rel=1e-4)
    # a student cut at l = L runs as the base model: the same numbers
    same = measure_long_context(convert_to_swiftkv(model, 4), tok, convs, SMALL, progress=False)
    assert [r["nll_sum"] for r in same["context"]] == pytest.approx([r["nll_sum"] for r in out["context"]], rel=1e-5)


def _result(gap_growth: float, exact: bool = True):
    passkey = [{"length": n, "depth": d, "sample": s, "key": "12345", "tokens": n, "key_logprob": -1.0,
                "exact": exact if s else True} for n in (512, 1024) for d in (0.1, 0.9) for s in range(4)]
    context = [{"conversation": f"c{i}", "context": n, "tokens": 100,
                "nll_sum": 100 * (1.0 + 0.01 * i + (gap_growth if n == 2048 else 0.0))}
               for i in range(12) for n in (128, 2048)]
    return {"model": "m", "passkey": passkey, "context": context}


def test_table_markdown_and_claim(tmp_path):
    from analysis.claims import evaluate
    from analysis.longctx import long_context_figure, long_context_markdown, long_context_table

    table = long_context_table({"base": _result(0.0), "s50": _result(0.02, exact=False), "s62": _result(0.3)},
                               {"base": "Base", "s50": "SwiftKV 50%", "s62": "SwiftKV 62.5%"})
    growth = table[table.kind == "growth"].set_index("variant")
    assert growth.loc["s50", "estimate"] == pytest.approx(0.02) and growth.loc["s62", "estimate"] == pytest.approx(0.3)
    pk = table[(table.kind == "passkey") & (table.depth == "all") & (table.variant == "s50")]
    assert list(pk.estimate) == [pytest.approx(0.25)] * 2 and list(pk.delta) == [pytest.approx(-0.75)] * 2
    long_context_figure(table).savefig(tmp_path / "f.png")
    md = long_context_markdown(table)
    assert "| SwiftKV 62.5% |" in md and "+0.300" in md and "(reference)" in md
    table.to_csv(tmp_path / "table_long_context.csv", index=False)
    row = evaluate(tmp_path, commit="x", registered_points=False).set_index("id").loc["long-context-loss-flat"]
    # s50 grows by 0.02 (within the 0.05 margin, no spread: holds); s62 by 0.3: does not hold, so the claim fails
    assert row.status == "decided" and row.verdict == "does not hold" and row.n_points == 2
    assert not math.isnan(row.estimate)
    # one long conversation (the first default run's context measure): reported, but it decides nothing
    few = table.copy()
    few.loc[few.kind == "growth", "n"] = 1
    few.to_csv(tmp_path / "table_long_context.csv", index=False)
    row = evaluate(tmp_path, commit="x", registered_points=False).set_index("id").loc["long-context-loss-flat"]
    assert row.status == "provisional" and "read 1 conversation(s)" in row.why


def test_committed_table_regenerates_from_its_raw_results_and_the_readme_quotes_it():
    from pathlib import Path

    import pandas as pd

    from analysis.io import read_json
    from analysis.longctx import long_context_markdown, long_context_table
    from analysis.raw import raw_path
    from analysis.stats import BootstrapSettings
    from tests.conftest import committed_raw

    root = Path(__file__).resolve().parents[1]
    raw, profile = committed_raw("long_context")
    cfg, boot = profile["long_context"], profile["eval"]["bootstrap"]
    committed = pd.read_csv(root / "reports" / "table_long_context.csv")
    results = {v: read_json(raw_path(raw, f"results/long_context/{m}/{v}.json"))
               for m in cfg["models"] for v in cfg["variants"]}
    table = long_context_table(results, dict(zip(committed.variant, committed.label)),
                               settings=BootstrapSettings(boot["resamples"], boot["confidence"], boot["seed"]))
    assert table.to_csv(index=False, float_format="%.4f") == (root / "reports" / "table_long_context.csv").read_text()
    assert long_context_markdown(committed) in (root / "reports" / "README.md").read_text()  # generated, not typed
