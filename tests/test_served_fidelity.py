"""Served-model fidelity (issue 18, part 3) without vLLM: the measures, the table, the README markdown and the
registered claim (the engine itself runs in tests/test_vllm_plugin.py)."""

import pytest

from swiftkv.bench.served_fidelity import Tolerance, summarize


def _rows(diff=1e-5, greedy=1.0):
    return [{"prompt": i, "prompt_tokens": 10, "hf_tokens": 4, "vllm_tokens": 4, "greedy": greedy,
             "logprob_max_abs": diff * 3, "logprob_mean_abs": diff, "topk": 1.0} for i in range(64)]


def _result(diff=1e-5):
    from dataclasses import asdict

    configs = {f"g{g}-{skip}": {"key_value_group_size": g, "prefill_skip": skip == "skip",
                                "kv_sharing_fast_prefill": skip == "skip", **summarize(_rows(diff), Tolerance())}
               for g in (1, 3) for skip in ("skip", "noskip")}
    return {"model": "m", "num_key_value_layers": 15, "settings": {"top_k": 5}, "tolerance": asdict(Tolerance()),
            "configs": configs}


def test_summary_weights_tokens_and_names_what_is_outside():
    ok = summarize(_rows(), Tolerance())
    assert ok["within_tolerance"] and ok["prompts"] == 64 and ok["generated_tokens"] == 256
    assert ok["logprob_max_abs"] == pytest.approx(3e-5) and ok["greedy_identical"] == 1.0
    bad = summarize(_rows(diff=0.05, greedy=0.5), Tolerance())
    assert not bad["within_tolerance"] and bad["outside"] == ["greedy_mean", "logprob_max_abs", "logprob_mean_abs"]


def test_table_markdown_and_claim(tmp_path):
    from analysis.claims import evaluate
    from analysis.serving import serving_fidelity_markdown, serving_fidelity_table

    table = serving_fidelity_table([_result()])
    assert len(table) == 4 and table.within_tolerance.all() and set(table.config) == {"g1-skip", "g1-noskip",
                                                                                       "g3-skip", "g3-noskip"}
    md = serving_fidelity_markdown(table)
    assert md.count("| m |") == 4 and "prefill skip off" in md and "max |Δ log p| <= 0.1" in md
    table.to_csv(tmp_path / "table_serving_fidelity.csv", index=False)
    row = evaluate(tmp_path, commit="x", registered_points=False).set_index("id").loc["served-model-faithful"]
    assert (row.status, row.verdict, row.n_points) == ("decided", "holds", 4) and "within tolerance" in row.why
    serving_fidelity_table([_result(diff=0.2)]).to_csv(tmp_path / "table_serving_fidelity.csv", index=False)
    row = evaluate(tmp_path, commit="x", registered_points=False).set_index("id").loc["served-model-faithful"]
    assert row.verdict == "does not hold" and "OUTSIDE tolerance" in row.why


def test_committed_table_regenerates_from_its_raw_results_and_the_readme_quotes_it():
    from pathlib import Path

    import pandas as pd

    from analysis.io import read_json
    from analysis.raw import raw_path
    from analysis.serving import serving_fidelity_markdown, serving_fidelity_table
    from tests.conftest import committed_raw

    root = Path(__file__).resolve().parents[1]
    raw, profile = committed_raw("served_fidelity")
    table = serving_fidelity_table([read_json(raw_path(raw, f"results/served_fidelity/{m}.json"))
                                    for m in profile["served_fidelity"]["models"]])
    assert table.to_csv(index=False, float_format="%.6g") == (root / "reports" / "table_serving_fidelity.csv").read_text()
    committed = pd.read_csv(root / "reports" / "table_serving_fidelity.csv")
    assert serving_fidelity_markdown(committed) in (root / "reports" / "README.md").read_text()  # generated, not typed


def test_engine_options_reach_the_vllm_command_and_the_bf16_tolerance_is_looser():
    """Issue 32, item 7: the GPU check serves in bf16 with FlashAttention, eagerly and with CUDA graphs."""
    from pathlib import Path

    from swiftkv.bench.served_fidelity import BF16_TOLERANCE, ServedFidelitySettings, vllm_command

    args = ("py", Path("m"), Path("p.json"), Path("o.json"))
    default = vllm_command(*args, ServedFidelitySettings())
    assert "--attention-backend" not in default and "--no-enforce-eager" not in default
    assert default[default.index("--dtype") + 1] == "float32"
    gpu = vllm_command(*args, ServedFidelitySettings(dtype="bfloat16", attention_backend="FLASH_ATTN",
                                                     enforce_eager=False))
    assert gpu[gpu.index("--attention-backend") + 1] == "FLASH_ATTN" and "--no-enforce-eager" in gpu
    assert gpu[gpu.index("--dtype") + 1] == "bfloat16"
    fp32 = Tolerance()
    assert BF16_TOLERANCE.logprob_max_abs > fp32.logprob_max_abs and BF16_TOLERANCE.greedy_mean < fp32.greedy_mean


def test_served_fidelity_cli_takes_the_engine_options():
    from swiftkv.cli import build_parser

    args = build_parser().parse_args(["bench", "served-fidelity", "smollm2-135m", "-l", "15", "-o", "x.json",
                                      "--engine-dtype", "bfloat16", "--attention-backend", "FLASH_ATTN",
                                      "--cuda-graphs", "--prefill-skip", "on"])
    assert (args.engine_dtype, args.attention_backend, args.cuda_graphs, args.prefill_skip) == \
        ("bfloat16", "FLASH_ATTN", True, "on")
