"""lm-eval integration: log-likelihoods through SwiftKVLM (shared-context prefill, prefill skip, FP8 cache) equal a
direct forward of the same model; the suite runs offline on a converted BIG-bench fixture task."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from torch.testing import assert_close
from transformers import PreTrainedTokenizerFast

from swiftkv import convert_to_swiftkv
from swiftkv.bench.evaluation import bench_eval
from swiftkv.measure.evaluate import TaskSpec, run_suite
from swiftkv.measure.lm import SwiftKVLM
from swiftkv.models.kvquant import FP8FakeQuantCache, fake_quant_fp8_per_token
from tests.conftest import TINY, tiny_base

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer over the tiny models' vocabulary: '<pad>', '<eos>', then 'w2' ... 'w100'."""
    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, TINY["vocab_size"])}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


def words(*ids: int) -> str:
    return " ".join(f"w{i}" for i in ids)


def direct_loglikelihood(model, context: list[int], continuation: list[int], max_length: int, cache_factory=None):
    """What the request means: one plain forward over (context + continuation)[:-1], every position computed."""
    full = (context + continuation)[-(max_length + 1):]
    ids = torch.tensor([full[:-1]])
    kwargs = {"use_cache": False}
    if cache_factory is not None:
        kwargs = {"use_cache": True, "cache": cache_factory(model.config)}
    if hasattr(model, "swiftkv") and model.config.swiftkv:
        model.model.prefill_skip = False
    try:
        logp = torch.log_softmax(model(input_ids=ids, **kwargs).logits[0].float(), -1)[-len(continuation):]
    finally:
        if hasattr(model, "swiftkv"):
            model.model.prefill_skip = True
    target = torch.tensor(continuation)
    return float(logp.gather(-1, target[:, None]).sum()), bool((logp.argmax(-1) == target).all())


def requests(seed: int = 0) -> list[tuple]:
    """Multiple-choice style requests (shared contexts, one- and multi-token choices) plus long ones that need
    left truncation, as lm-eval's (key, context tokens, continuation tokens)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n_ctx in (3, 7, 12, 30):
        ctx = torch.randint(2, TINY["vocab_size"], (n_ctx,), generator=gen).tolist()
        for n_cont in (1, 1, 2, 5):
            cont = torch.randint(2, TINY["vocab_size"], (n_cont,), generator=gen).tolist()
            out.append((None, ctx, cont))
    out.append((None, [5], torch.randint(2, 50, (20,), generator=gen).tolist()))  # a rolling-style window
    return out


MODELS = {
    "base": lambda b: b,
    "teacher": lambda b: convert_to_swiftkv(b, 2).swiftkv(False),
    "student": lambda b: convert_to_swiftkv(b, 2),
    "student-acrosskv": lambda b: convert_to_swiftkv(b, 1, 3),
}


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("kv_cache", ["native", "fp8"])
@pytest.mark.parametrize("scorer", ["packed", "chunked"])
@torch.no_grad()
def test_loglikelihoods_equal_direct_forward(family, kind, kv_cache, scorer, monkeypatch):
    model = MODELS[kind](tiny_base(family))
    # packed: rows of 24 positions, two rows a forward, so rows hold several questions and forwards several rows;
    # the 101-token vocabulary projected in four chunks (swiftkv.measure.head), the last one short
    monkeypatch.setattr("swiftkv.measure.lm.PACK_WIDTH", 24)
    monkeypatch.setattr("swiftkv.measure.head.VOCAB_CHUNK", 32)
    lm = SwiftKVLM(model, tokenizer=tiny_tokenizer(), batch_size=3, max_length=24, kv_cache=kv_cache,
                   teacher=(kind == "teacher"), device="cpu", scorer=scorer, positions_per_forward=64)
    reqs = requests()
    shapes, masks = [], []

    def record(module, args, kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))
        masks.append(tuple(kwargs["attention_mask"].shape) if kwargs.get("attention_mask") is not None else None)

    hook = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        got = lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    finally:
        hook.remove()
    assert lm.last_path == scorer and len(shapes) == lm.forwards
    if scorer == "packed":
        assert max(mask[0] for mask in masks) == 2 and lm.forwards < len({tuple(c) for _, c, _ in reqs})
        # a plain model (the teacher too) runs each distinct position of a forward once (swiftkv.measure.shared_rows)
        assert all(rows == 1 for rows, _ in shapes) == (kind in ("base", "teacher"))
    factory = (lambda config: FP8FakeQuantCache(config=config)) if kv_cache == "fp8" else None
    want = [direct_loglikelihood(model, c, t, 24, factory) for _, c, t in reqs]
    assert_close(torch.tensor([g[0] for g in got]), torch.tensor([w[0] for w in want]), rtol=1e-4, atol=1e-4)
    assert [g[1] for g in got] == [w[1] for w in want]


def test_the_prefix_tree_runs_each_shared_prefix_once_per_row():
    """``plan_rows``: questions that share their instructions share those positions in a row; every node a request
    scores is kept exactly once; every row holds each node's ancestors before it, and its mask lets a node see exactly
    its ancestors and itself."""
    from swiftkv.measure.prefix_tree import PrefixTree, plan_rows, row_arrays

    tree = PrefixTree()
    header = list(range(2, 12))  # shared by every question
    scored = set()
    for q in range(12):
        end = tree.insert(header + [100 + 10 * q + k for k in range(6)])[-1]
        for choice in ([40], [41, 42], [41, 43]):  # two choices share their first token
            scored.update([end] + tree.insert(choice[:-1], end))
    assert len(tree) - 1 == 12 * (len(header) + 6 + 1) - 11 * len(header)  # the header once, [41] once per question
    forwards = list(plan_rows(tree, scored, width=24, max_positions=48, score_budget=1000, attention_cost=1 / 3456))
    rows = [row for rows in forwards for row in rows]
    kept = [row.nodes[c] for row in rows for c in row.scored]
    assert sorted(kept) == sorted(scored)
    assert len(rows) > 1 and all(len(rows) * max(len(r.nodes) for r in rows) <= 48 for rows in forwards)
    assert sum(len(row.nodes) for row in rows) == len(tree) - 1 + (len(rows) - 1) * len(header)  # a header per row
    for rows in forwards:
        ids, positions, mask = row_arrays(tree, rows)
        for r, row in enumerate(rows):
            for col, node in enumerate(row.nodes):
                sees = {row.nodes[k] for k in range(len(row.nodes)) if mask[r, 0, col, k]}
                assert sees == set(tree.ancestors(node)) | {node}
                assert positions[r, col] == tree.depth[node] - 1 and ids[r, col] == tree.token[node]


def test_a_long_shared_context_stays_in_one_row_rather_than_copied_per_row():
    """A subtree wider than a row whose ancestors are long (a long question with long choices) is one unit in a wider
    row when copying the ancestors per row would cost more; with short ancestors it is cut into rows."""
    from swiftkv.measure.prefix_tree import PrefixTree, units

    tree = PrefixTree()
    end = tree.insert(list(range(2, 202)))[-1]  # a 200-token context
    for k in range(4):
        tree.insert([300 + k] * 30, end)  # four 30-token choices
    size = tree.sizes()
    (unit,) = units(tree, size, 64, 1024, 1 / 3456)  # the whole question in one row of 320
    assert tree.depth[unit] - 1 + size[unit] == 320
    tree = PrefixTree()
    end = tree.insert([2, 3])[-1]  # a 2-token context
    for k in range(4):
        tree.insert([300 + k] * 30, end)
    assert len(units(tree, tree.sizes(), 64, 1024, 1 / 3456)) == 4  # one choice a unit, rows of 64


@pytest.mark.parametrize("kind", ["base", "student"])
@torch.no_grad()
def test_rolling_windows_sharing_one_token_are_packed_in_rows_no_wider_than_a_forward(kind, monkeypatch):
    """Rolling log-likelihood windows all share lm-eval's one-token context. The windows go into rows of at most
    positions_per_forward positions, each with the shared token (one row of every window was as wide as all the
    windows together, whose attention costs width**2), and every log-likelihood still equals a direct forward."""
    model = MODELS[kind](tiny_base())
    monkeypatch.setattr("swiftkv.measure.lm.PACK_WIDTH", 24)
    lm = SwiftKVLM(model, tokenizer=tiny_tokenizer(), max_length=40, device="cpu", positions_per_forward=48)
    gen = torch.Generator().manual_seed(3)
    reqs = [(None, [1], torch.randint(2, TINY["vocab_size"], (n,), generator=gen).tolist())
            for n in (30, 9, 21, 14, 5, 27, 17, 11)]  # 134 scored positions behind one shared context
    masks = []  # (rows, 1, width, width) of each forward
    hook = model.register_forward_pre_hook(lambda m, a, k: masks.append(k["attention_mask"].shape), with_kwargs=True)
    try:
        got = lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    finally:
        hook.remove()
    assert lm.last_path == "packed" and max(m[0] * m[-1] for m in masks) <= 48 and lm.forwards >= 3
    # the shared token: once a forward where the base model runs each distinct position once, else once a row
    assert lm.tokens_run["context"] == (lm.forwards if kind == "base" else sum(m[0] for m in masks))
    assert lm.tokens_run["context"] < sum(m[0] for m in masks) or kind == "student"
    assert lm.tokens_run["continuation"] == 134 - len(reqs)  # every other position once
    want = [direct_loglikelihood(model, c, t, 40) for _, c, t in reqs]
    assert_close(torch.tensor([g[0] for g in got]), torch.tensor([w[0] for w in want]), rtol=1e-4, atol=1e-4)
    assert [g[1] for g in got] == [w[1] for w in want]


@torch.no_grad()
def test_student_prefill_skips_later_layers():
    """Context positions of a student stop at layer l: layer l sees only the last context position in the prefill."""
    model = convert_to_swiftkv(tiny_base(), 2)
    seen = []
    hook = model.model.layers[2].register_forward_hook(lambda m, a, k, o: seen.append(a[0].shape[1]) if a else None,
                                                       with_kwargs=True)
    seen_first = []
    hook0 = model.model.layers[0].register_forward_hook(lambda m, a, k, o: seen_first.append(a[0].shape[1]),
                                                        with_kwargs=True)
    try:
        lm = SwiftKVLM(model, tokenizer=tiny_tokenizer(), batch_size=1, device="cpu")
        lm._loglikelihood_tokens([(None, list(range(2, 22)), [30])], disable_tqdm=True)
    finally:
        hook.remove()
        hook0.remove()
    assert seen_first == [20] and seen == [1]


def test_fp8_fake_quant_rounds_per_token():
    """e4m3 keeps 3 mantissa bits: relative error <= 2**-4 for normal values, one scale per (batch, token)."""
    x = torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(0)) * torch.tensor([1.0, 100.0, 1e-3, 7.0, 0.5])[:, None]
    q = fake_quant_fp8_per_token(x)
    scale = x.abs().amax(dim=(1, 3), keepdim=True) / 448
    assert not torch.equal(q, x)
    assert ((q - x).abs() <= x.abs() * 2**-4 + scale * 2**-9).all()
    assert torch.equal(q.abs().amax(dim=(1, 3)), x.abs().amax(dim=(1, 3)))  # the largest value per token is exact


@torch.no_grad()
def test_fp8_cache_is_used_by_teacher_and_student_layers():
    base = tiny_base()
    student = convert_to_swiftkv(tiny_base(), 2)
    ids = torch.randint(2, 100, (1, 16), generator=torch.Generator().manual_seed(0))
    for model in (base, student):
        cache = FP8FakeQuantCache(config=model.config)
        out = model(ids, cache=cache, use_cache=True).logits
        assert not torch.equal(out, model(ids, use_cache=False).logits)
        k = cache.layers[0].keys
        assert torch.equal(k, fake_quant_fp8_per_token(k))  # what the cache holds is already on the FP8 grid


def test_kv_memory_matches_the_paper():
    """Llama-3.1-8B, 50% SwiftKV + 4-way AcrossKV: 37.5% smaller KV cache; with FP8 68.75% (paper Table B.1)."""
    from transformers import LlamaConfig

    from swiftkv.models.convert import swiftkv_config_from
    from swiftkv.models.kvquant import kv_memory

    base = LlamaConfig(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096)
    cfg = swiftkv_config_from(base, 16, 4)
    assert kv_memory(base)["reduction"] == 0
    assert kv_memory(cfg)["reduction"] == pytest.approx(0.375)
    assert kv_memory(cfg, "fp8")["reduction"] == pytest.approx(0.6875)
    assert kv_memory(swiftkv_config_from(base, 16, 1), "fp8")["reduction"] == pytest.approx(0.5)
    mqa = swiftkv_config_from(base, 16, 1, swiftkv_key_value_heads=2)
    assert kv_memory(mqa)["reduction"] == pytest.approx(kv_memory(cfg)["reduction"])  # the Table B.2 budget


def fixture_task(tmp_path):
    from swiftkv.data.bigbench import write_lm_eval_tasks

    examples = [{"input": words(2 + i, 3 + i, 4 + i), "target_scores": {words(10 + i): 1, words(40 + i): 0, words(70 + i, 5): 0}}
                for i in range(12)]
    task = {"name": "fixture", "examples": examples}
    return write_lm_eval_tasks({"fixture": task}, tmp_path / "tasks")


@torch.no_grad()
def test_suite_through_lm_eval_matches_direct_forward(tmp_path):
    """Per-sample log-likelihoods that lm-eval logs for a student equal direct forwards of the same strings."""
    model = convert_to_swiftkv(tiny_base(), 2)
    tok = tiny_tokenizer()
    manifest = fixture_task(tmp_path)
    lm = SwiftKVLM(model, tokenizer=tok, batch_size=4, device="cpu")
    out = run_suite(lm, [TaskSpec(name="bb_fixture_report")], [manifest["splits"]["report"]])
    samples = out["samples"]["bb_fixture_report"]
    assert len(samples) == manifest["tasks"]["fixture"]["splits"]["report"]["n"] > 0
    for sample in samples:
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"]):
            ctx = tok(context, add_special_tokens=False)["input_ids"]
            whole = tok(context + continuation, add_special_tokens=False)["input_ids"]
            ll, greedy = direct_loglikelihood(model, ctx, whole[len(ctx):], lm.max_length)
            assert abs(float(resp[0][0]) - ll) < 1e-4 and bool(resp[0][1]) == greedy
    assert 0 <= out["results"]["bb_fixture_report"]["acc,none"] <= 1
    assert out["swiftkv"]["prefill_skip"] is True
    json.dumps(out, default=str)  # the whole result (samples included) serialises


@pytest.mark.slow  # lm-eval's CLI indexes its thousands of built-in task YAMLs: minutes on a busy 2-core machine
def test_lm_eval_cli_runs_a_swiftkv_checkpoint(tmp_path):
    """The documented one line: lm-eval's own CLI (``--model hf``) on a saved SwiftKV checkpoint, via
    ``python -m swiftkv.measure.harness``; its scores equal those of our in-process SwiftKVLM."""
    import subprocess
    import sys

    ckpt = tmp_path / "ckpt"
    model = convert_to_swiftkv(tiny_base(), 2)
    model.save_pretrained(ckpt)
    tiny_tokenizer().save_pretrained(ckpt)
    manifest = fixture_task(tmp_path)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "swiftkv.measure.harness", "--model", "hf", "--model_args", f"pretrained={ckpt},dtype=float32",
           "--tasks", "bb_fixture_report", "--include_path", manifest["splits"]["report"], "--device", "cpu",
           "--batch_size", "4", "--output_path", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(next(out.rglob("results_*.json")).read_text())
    ours = run_suite(SwiftKVLM(model, tokenizer=tiny_tokenizer(), batch_size=4, device="cpu"),
                     [TaskSpec(name="bb_fixture_report")], [manifest["splits"]["report"]])
    assert result["results"]["bb_fixture_report"]["acc,none"] == ours["results"]["bb_fixture_report"]["acc,none"]
    assert result["config"]["model"] == "hf"


@pytest.mark.parametrize("case", ["eager", "window-short", "window-long", "window-long-fp8"])
@pytest.mark.parametrize("kind", ["base", "student"])
@torch.no_grad()
def test_scoring_paths_for_eager_masks_and_sliding_windows(case, kind):
    """Eager attention takes the packed 4D mask as an additive float mask. A sliding window that every request fits
    in leaves the packed scorer exact; one that a request runs past sends every request to a full forward of its
    own (a shared context's cache and a packed mask would both see past the window). All equal a direct forward."""
    window = {"window-short": 30, "window-long": 8, "window-long-fp8": 8}.get(case)
    base = (tiny_base("llama", attn_implementation="eager") if case == "eager"
            else tiny_base("mistral", sliding_window=window))
    model = convert_to_swiftkv(base, 2) if kind == "student" else base
    kv_cache = "fp8" if case.endswith("fp8") else "native"
    lm = SwiftKVLM(model, tokenizer=tiny_tokenizer(), batch_size=3, max_length=24, device="cpu", kv_cache=kv_cache)
    reqs = requests()
    got = lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    assert lm.last_path == ("full" if case.startswith("window-long") else "packed")
    factory = (lambda config: FP8FakeQuantCache(config=config)) if kv_cache == "fp8" else None
    want = [direct_loglikelihood(model, c, t, 24, factory) for _, c, t in reqs]
    assert_close(torch.tensor([g[0] for g in got]), torch.tensor([w[0] for w in want]), rtol=1e-4, atol=1e-4)
    assert [g[1] for g in got] == [w[1] for w in want]


@torch.no_grad()
def test_bench_eval_alternates_the_scorers_and_finds_them_equal(tmp_path):
    """``swiftkv bench eval``'s core: warm-up, then each repeat runs both scorers, the order alternating; the scorers
    agree on every logged log-likelihood, greedy flag and score, and the packed one runs fewer forwards."""
    model = convert_to_swiftkv(tiny_base(), 2)
    manifest = fixture_task(tmp_path)
    n = manifest["tasks"]["fixture"]["splits"]["report"]["n"]
    out = bench_eval(model, tiny_tokenizer(), [TaskSpec(name="bb_fixture_report")], [manifest["splits"]["report"]],
                     repeats=2, warmup_limit=2, batch_size=2)
    assert [(r["repeat"], r["scorer"], r["path"]) for r in out["runs"]] == [
        (0, "chunked", "chunked"), (0, "packed", "packed"), (1, "packed", "packed"), (1, "chunked", "chunked")]
    assert all(r["examples"] == n > 0 and 0 < r["seconds_scoring"] < r["seconds"] for r in out["runs"])
    forwards = {r["scorer"]: r["forwards"] for r in out["runs"]}
    assert forwards["packed"] < forwards["chunked"]
    agree = out["agreement"]["packed"]
    assert agree["requests"] == 3 * n and agree["same_requests"] and agree["greedy_flags_equal"] and agree["scores_equal"]
    assert agree["max_abs_loglikelihood_diff"] < 1e-4
    assert out["reference"] == "chunked" and out["speedup"]["chunked"] == 1.0 and out["speedup"]["packed"] > 0
    assert out["hardware"]["cpu"] and json.dumps(out)


@torch.no_grad()
def test_tasks_rebuilt_from_a_record_ask_the_recorded_requests(tmp_path):
    """``swiftkv bigbench from-record``: the BIG-bench tasks of a logged run come back as the same docs in the same
    order, so a second run on them asks the same requests and gets the same answers; a record that is not of a
    cloze task is refused without writing anything."""
    from swiftkv.data.bigbench import tasks_from_record
    from swiftkv.errors import SwiftKVError

    model = convert_to_swiftkv(tiny_base(), 2)
    manifest = fixture_task(tmp_path)
    first = run_suite(SwiftKVLM(model, tokenizer=tiny_tokenizer(), batch_size=4, device="cpu"),
                      [TaskSpec(name="bb_fixture_report")], [manifest["splits"]["report"]])
    record = json.loads(json.dumps(first, default=str))
    rebuilt = tasks_from_record(record, tmp_path / "rebuilt")
    assert list(rebuilt["splits"]) == ["report"] and rebuilt["tasks"]["bb_fixture"]["splits"]["report"]["n"] == len(
        first["samples"]["bb_fixture_report"])
    assert (tmp_path / "rebuilt/report/bb_fixture.jsonl").read_text() == (
        tmp_path / "tasks/report/bb_fixture.jsonl").read_text()
    again = run_suite(SwiftKVLM(model, tokenizer=tiny_tokenizer(), batch_size=4, device="cpu"),
                      [TaskSpec(name="bb_fixture_report")], [rebuilt["splits"]["report"]])
    key = lambda s: s["doc_id"]  # noqa: E731
    for a, b in zip(sorted(first["samples"]["bb_fixture_report"], key=key),
                    sorted(again["samples"]["bb_fixture_report"], key=key)):
        assert a["arguments"] == b["arguments"] and a["resps"] == b["resps"]
    sample = record["samples"]["bb_fixture_report"][0]
    sample["arguments"][0] = [sample["arguments"][0][0] + " extra", sample["arguments"][0][1]]
    with pytest.raises(SwiftKVError, match="not the doc's prompt and choice"):
        tasks_from_record(record, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def test_packed_forwards_keep_their_logits_within_the_budget():
    """Every packed forward holds rows x (the most scored positions of a row) <= the logits budget, and every scored
    node once, whatever the mix of long and short questions."""
    from swiftkv.measure.prefix_tree import PrefixTree, plan_rows

    model = tiny_base()
    lm = SwiftKVLM(model, tokenizer=tiny_tokenizer(), device="cpu", positions_per_forward=1024,
                   logits_budget_bytes=8 * TINY["vocab_size"] * 300)  # 300 scored positions a forward
    gen = torch.Generator().manual_seed(0)
    tree, scored = PrefixTree(), set()
    for k in range(60):
        ctx = torch.randint(2, 90, (int(torch.randint(2, 40, (1,), generator=gen)),), generator=gen).tolist() + [k]
        end = tree.insert(ctx)[-1]
        scored.update([end] + tree.insert([5] * (int(torch.randint(1, 30, (1,), generator=gen)) - 1), end))
    forwards = list(plan_rows(tree, scored, width=256, max_positions=1024, score_budget=lm._position_budget(),
                              attention_cost=1 / 3456))
    assert lm._position_budget() == 300 and len(forwards) > 1 and max(len(rows) for rows in forwards) > 1
    seen = []
    for rows in forwards:
        assert len(rows) * max(len(row.scored) for row in rows) <= 300
        seen += [row.nodes[c] for row in rows for c in row.scored]
    assert sorted(seen) == sorted(scored)
