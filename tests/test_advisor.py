"""swiftkv advise (issue 18, part 2): candidates, untrained KL, savings, Pareto front, calibration and advice, on
tiny random models and hand-made numbers."""

import json
import math

import pytest
import torch

from swiftkv.errors import SwiftKVError
from swiftkv.measure.advisor import (
    AdvisorSettings,
    Calibration,
    Candidate,
    TrainedPoint,
    advise,
    calibrate,
    candidates,
    measure_candidates,
    pareto_front,
)
from tests.conftest import tiny_base, tiny_conversations, tiny_tokenizer

SMALL = AdvisorSettings(skips=(0.25, 0.5, 0.75), group_sizes=(1, 2), num_sequences=6, max_tokens=48, batch_size=3,
                        n_resamples=200)


def test_candidates_follow_the_skips_and_keep_only_dividing_group_sizes():
    got = candidates(8, AdvisorSettings(skips=(0.25, 0.5, 0.75), group_sizes=(1, 3, 2)))
    # l = 6, 4, 2 -> L - l = 2, 4, 6: g = 2 divides all, g = 3 only 6
    assert got == [Candidate(6, 1), Candidate(6, 2), Candidate(4, 1), Candidate(4, 2), Candidate(2, 1),
                   Candidate(2, 2), Candidate(2, 3)]
    assert [c.label for c in got[:2]] == ["l=6", "l=6, g=2"]
    assert candidates(4, AdvisorSettings(skips=(0.1, 0.2))) == [Candidate(3, 1)]  # both round to l = 4 -> L - 1
    with pytest.raises(SwiftKVError, match="between 0 and 1"):
        candidates(8, AdvisorSettings(skips=(50,)))


def test_pareto_front():
    rows = [{"prefill_saved": 0.25, "untrained_kl": 0.1}, {"prefill_saved": 0.5, "untrained_kl": 0.3},
            {"prefill_saved": 0.5, "untrained_kl": 0.4},  # beaten: same saving, more loss
            {"prefill_saved": 0.25, "untrained_kl": 0.2},  # beaten by the first
            {"prefill_saved": 0.75, "untrained_kl": 1.0}]
    assert pareto_front(rows) == [True, True, False, False, True]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_measure_candidates_on_a_tiny_model(family):
    model = tiny_base(family)
    out = measure_candidates(model, tiny_tokenizer(), tiny_conversations(12), SMALL, progress=False)
    rows = {(r["num_key_value_layers"], r["key_value_group_size"]): r for r in out["rows"]}
    assert set(rows) == {(3, 1), (2, 1), (2, 2), (1, 1)}  # L = 4: l = 3, 2, 1; g = 2 divides L - l = 2 only
    for r in out["rows"]:
        assert r["untrained_kl_lo"] <= r["untrained_kl"] <= r["untrained_kl_hi"] and 0 <= r["untrained_top1"] <= 1
        assert r["skipped"] == (4 - r["num_key_value_layers"]) / 4
    # a cut at l = L - 1 is the teacher itself (the reference init copies layer L-1's own K/V path); Eq. 1 has no
    # later layer there; every earlier cut changes the model
    assert rows[(3, 1)]["untrained_kl"] < 1e-6 and math.isnan(rows[(3, 1)]["simscore"])
    assert all(rows[c]["untrained_kl"] > 1e-4 and -1 <= rows[c]["simscore"] <= 1 for c in [(2, 1), (2, 2), (1, 1)])
    # more layers skipped: more prefill saved; the KV cache shrinks only with AcrossKV (SwiftKV alone caches L layers)
    assert rows[(1, 1)]["prefill_saved"] > rows[(2, 1)]["prefill_saved"] > rows[(3, 1)]["prefill_saved"] > 0
    assert rows[(2, 2)]["kv_saved"] == pytest.approx(0.25) and rows[(2, 1)]["kv_saved"] == 0
    assert any(r["pareto"] for r in out["rows"])
    # the untrained KL is the fidelity module's KL of the converted student (same sequences, same definition)
    from swiftkv.measure.fidelity import teacher_forced, teacher_forced_sequences
    from swiftkv.models.convert import convert_to_swiftkv

    seqs = teacher_forced_sequences(tiny_tokenizer(), tiny_conversations(12), SMALL.num_sequences, SMALL.max_tokens)
    per = teacher_forced(model, convert_to_swiftkv(model, 2, 1), seqs, progress=False)
    assert rows[(2, 1)]["untrained_kl"] == pytest.approx(sum(r["kl_sum"] for r in per) / sum(r["tokens"] for r in per),
                                                         rel=1e-4)


def test_the_advisor_refuses_a_swiftkv_checkpoint():
    from swiftkv.models.convert import convert_to_swiftkv

    with pytest.raises(SwiftKVError, match="base model"):
        measure_candidates(convert_to_swiftkv(tiny_base(), 2), tiny_tokenizer(), tiny_conversations(4), SMALL,
                           progress=False)


def _rows(kls, simscores):
    return [{"candidate": f"l={l}", "num_key_value_layers": l, "key_value_group_size": 1, "untrained_kl": kl,
             "simscore": s, "prefill_saved": (8 - l) / 8, "kv_saved": 0.0}
            for l, kl, s in zip(range(7, 7 - len(kls), -1), kls, simscores)]


def test_calibration_ranks_and_predicts():
    rows = _rows([0.1, 0.2, 0.4, 0.8, 1.6], [0.9, 0.8, 0.7, 0.6, 0.5])
    trained = [TrainedPoint(f"t{l}", l, 1, 0.5 * kl ** 0.5) for l, kl in zip(range(7, 2, -1), [0.1, 0.2, 0.4, 0.8, 1.6])]
    cal = calibrate(rows, trained, SMALL)
    assert cal.n == 5 and cal.rho["untrained_kl"][0] == pytest.approx(1.0)
    assert cal.rho["simscore"][0] == pytest.approx(-1.0)  # lower SimScore, larger trained loss
    assert cal.slope == pytest.approx(0.5) and cal.predict(0.4) == pytest.approx(0.5 * 0.4 ** 0.5)
    lo, hi = cal.rho["untrained_kl"][1:]
    assert lo <= 1.0 <= hi + 1e-12
    # the advice uses the calibrated prediction: trained KL 0.5 * sqrt(0.8) = 0.447 <= 0.45 -> l = 4 (50% skipped)
    got = advise(rows, 0.45, cal)
    assert got["calibrated"] and got["recommended"] == "l=4" and "over 5 trained rows at 5 distinct cuts" in got["trust"]
    # two group sizes at one l are one cut, not two
    rows_g = [{"num_key_value_layers": 15, "key_value_group_size": g} for g in (1, 3, 5)]
    assert Calibration(n=3, points=rows_g).distinct_l == 1
    # uncalibrated: the untrained KL itself is held to the tolerance (safe side) -> l = 5
    got = advise(rows, 0.45, calibrate(rows, trained[:2], SMALL))
    assert not got["calibrated"] and got["recommended"] == "l=5" and got["trust"].startswith("uncalibrated: 2")
    assert advise(rows, 0.01)["recommended"] is None
    with pytest.raises(SwiftKVError, match="tolerance"):
        advise(rows, 0.0)


def test_calibration_skips_trained_cuts_the_advisor_did_not_measure(caplog):
    cal = calibrate(_rows([0.1, 0.2], [0.9, 0.8]), [TrainedPoint("far", 1, 1, 2.0)], SMALL)
    assert cal.n == 0 and "no advisor candidate" in caplog.text and math.isnan(Calibration(n=0).predict(0.3))


def test_swiftkv_advise_command_line(tmp_path, monkeypatch, capsys):
    """The command on a tiny model saved to disk, with a trained CSV and a tolerance; bad input: one line."""
    from swiftkv.cli import main
    from swiftkv.data.heldout import write_conversations

    model_dir = tmp_path / "tiny"
    tiny_base().save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    heldout = tmp_path / "heldout.jsonl"
    write_conversations(tiny_conversations(8), heldout)
    trained = tmp_path / "trained.csv"
    trained.write_text("label,num_key_value_layers,key_value_group_size,kl\na,3,1,0.1\nb,2,1,0.2\nc,1,1,0.4\n")
    out = tmp_path / "advice.json"
    assert main(["advise", str(model_dir), "--heldout", str(heldout), "--num-sequences", "4", "--max-tokens", "40",
                 "--skips", "0.25", "0.5", "0.75", "--trained", str(trained), "--tolerance", "5", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert len(result["rows"]) == 3 and result["calibration"]["n"] == 3 and result["advice"]["recommended"] == "l=1"
    assert "tolerance 5 nats/token" in text and "trust: " in text
    trained.write_text("label,l,kl\na,3,0.1\n")
    assert main(["advise", str(model_dir), "--heldout", str(heldout), "--trained", str(trained), "-o",
                 str(tmp_path / "x.json")]) == 2
    assert "needs the columns" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def _result(model="m"):
    """An advisor result as `swiftkv advise` writes it (L = 8), untrained KL rising as l falls."""
    from dataclasses import asdict

    rows = []
    for l, g, kl, sim in ((6, 1, 0.1, 0.9), (4, 1, 0.4, 0.7), (4, 2, 0.6, 0.7), (2, 1, 1.2, 0.5), (1, 1, 2.0, 0.4)):
        rows.append({"candidate": Candidate(l, g).label, "num_key_value_layers": l, "key_value_group_size": g,
                     "num_layers": 8, "skipped": (8 - l) / 8, "untrained_kl": kl, "untrained_kl_lo": kl * 0.9,
                     "untrained_kl_hi": kl * 1.1, "untrained_top1": 1 - kl / 3, "untrained_top1_lo": 0.0,
                     "untrained_top1_hi": 1.0, "prefill_saved": (8 - l) / 8 * 0.9, "kv_saved": 1 - (l + (8 - l) / g) / 8,
                     "simscore": sim, "simscore_lo": sim - 0.05, "simscore_hi": sim + 0.05})
    for row, front in zip(rows, pareto_front(rows)):
        row["pareto"] = front
    return {"model": model, "settings": asdict(SMALL), "rows": rows}


def test_advisor_page_calibrates_on_table2_rows_of_the_recipe(tmp_path):
    """Table 2 rows of the recipe calibrate (MQA, LM-loss and other models' rows do not); the table, the calibration,
    the figure and the README markdown come out of one call each."""
    import pandas as pd

    from analysis.advisor import advisor_figure, advisor_markdown, advisor_tables, trained_points

    sheet = [{"model": "m", "variant": v, "num_key_value_layers": l, "key_value_group_size": g, "kv_heads": h,
              "loss": loss, "scope": "partial", "train": "yes" if v != "base" else "no", "label": v}
             for v, l, g, h, loss in (("base", 8, 1, None, "none"), ("s25", 6, 1, None, "kl"), ("s50", 4, 1, None, "kl"),
                                      ("s50-a2", 4, 2, None, "kl"), ("s75", 2, 1, None, "kl"),
                                      ("s50-mqa", 4, 1, 1, "kl"), ("s50-lm", 4, 1, None, "lm"))]
    table2 = pd.DataFrame([{"model": "m", "variant": v, "kv_cache": "native", "kl": kl, "kl_lo": kl - 0.01,
                            "kl_hi": kl + 0.01} for v, kl in (("base", 0.0), ("s25", 0.05), ("s50", 0.2),
                                                               ("s50-a2", 0.3), ("s75", 0.5), ("s50-mqa", 0.9),
                                                               ("s50-lm", 0.25))])
    points = trained_points(table2, sheet, "m")
    assert [p.label for p in points] == ["s25", "s50", "s50-a2", "s75"]
    cands, cal = advisor_tables([_result()], table2, sheet, tolerance=0.25)
    assert [t if isinstance(t, str) else None for t in cands.trained] == ["s25", "s50", "s50-a2", "s75", None]
    u = cal.set_index("predictor").loc["untrained_kl"]
    assert (u.trained_points, u.distinct_l, u.spearman) == (4, 3, pytest.approx(1.0))
    assert cal.set_index("predictor").loc["simscore", "spearman"] == pytest.approx(-1.0, abs=0.06)  # tie at l = 4
    assert cands.recommended.sum() == 1 and u.recommended == cands[cands.recommended].candidate.iloc[0]
    fig = advisor_figure(cands, cal)
    fig.savefig(tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 10_000
    md = advisor_markdown(cands, cal)
    assert "**(advice)**" in md and "Calibration on 4 trained rows (3 distinct l)" in md


def test_simscore_claim_reads_the_calibration_and_decides_only_with_enough_cuts(tmp_path):
    from analysis.claims import PROVISIONAL, evaluate

    rows = ("model,predictor,trained_points,distinct_l,spearman,spearman_lo,spearman_hi,tolerance,recommended,trust\n"
            "m,untrained_kl,5,3,0.9,0.5,1.0,0.5,l=4,t\nm,simscore,5,3,-0.9,-1.0,-0.4,0.5,l=4,t\n")
    (tmp_path / "table_advisor_calibration.csv").write_text(rows)
    row = evaluate(tmp_path, commit="x", registered_points=False).set_index("id").loc["simscore-predicts-loss"]
    assert row.status == PROVISIONAL and "fewer than 5 distinct trained cuts" in row.why and row.n_points == 1
    (tmp_path / "table_advisor_calibration.csv").write_text(rows.replace(",5,3,", ",6,5,"))
    row = evaluate(tmp_path, commit="x", registered_points=False).set_index("id").loc["simscore-predicts-loss"]
    assert row.status == "decided" and row.verdict == "holds"


def test_committed_advisor_tables_regenerate_from_their_raw_results_and_the_readme_quotes_them():
    from pathlib import Path

    import pandas as pd

    from analysis.advisor import advisor_markdown, advisor_tables
    from analysis.io import read_json
    from analysis.raw import raw_path
    from tests.conftest import committed_raw, committed_sheet

    root = Path(__file__).resolve().parents[1]
    raw, profile = committed_raw("advisor")
    sheet = committed_sheet("table2", dtype=None)  # the rows of the committed Table 2 the calibration reads
    rows = [{**r, "kv_heads": r["kv_heads"] or None} for r in sheet.to_dict("records")]
    results = [read_json(raw_path(raw, f"results/advise/{m}.json")) for m in profile["advise"]["models"]]
    cands, cal = advisor_tables(results, pd.read_csv(root / "reports" / "table2.csv"), rows,
                                profile["advise"]["tolerance"])
    assert cands.to_csv(index=False, float_format="%.4f") == (root / "reports" / "table_advisor.csv").read_text()
    assert cal.to_csv(index=False, float_format="%.4f") == (root / "reports" / "table_advisor_calibration.csv").read_text()
    committed = [pd.read_csv(root / "reports" / n) for n in ("table_advisor.csv", "table_advisor_calibration.csv")]
    assert advisor_markdown(*committed) in (root / "reports" / "README.md").read_text()  # generated from the CSVs, not typed
