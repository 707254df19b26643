"""analysis/: tables and figures from small fixture data with known answers (Agg backend, files only)."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from analysis.figures import forward_time_figure, forward_time_title, simscore_figure, simscore_subtitle  # noqa: E402
from analysis.io import read_flops, read_prefill_time, read_simscore, save_figure  # noqa: E402
from analysis.paper import paper_table  # noqa: E402
from analysis.tables import crossing_layer, kv_memory, simscore_crossings, table1, to_markdown  # noqa: E402


def simscore_fixture(tmp_path) -> list:
    paths = []
    for model, L, shift in (("a", 10, 0.0), ("b", 6, 0.2)):
        rows = []
        for metric, offset in (("cosine", 0.1), ("centred", -0.1), ("no_outliers", 0.0)):
            for l in range(L - 1):
                v = min(1.0, l / L + offset + shift)  # rising with depth
                rows.append({"model": model, "metric": metric, "layer": l, "num_layers": L, "depth": l / L,
                             "simscore": v, "ci_low": v - 0.02, "ci_high": v + 0.02, "tokens": 100})
        path = tmp_path / f"{model}.csv"
        pd.DataFrame(rows).to_csv(path, index=False)
        paths.append(path)
    return paths


def test_crossing_layer():
    assert crossing_layer([0.1, 0.6, 0.4, 0.5, 0.7]) == 3  # from where it *stays* above
    assert crossing_layer([0.6, 0.7]) == 0
    assert crossing_layer([0.6, 0.4]) is None


def test_simscore_crossings_and_figure(tmp_path):
    df = read_simscore(simscore_fixture(tmp_path))
    c = simscore_crossings(df).set_index(["model", "metric"])
    # model a, cosine: l/10 + 0.1 >= 0.5 from l = 4; model b: l/6 + 0.3 >= 0.5 from l = 2 (0.633)
    assert c.loc[("a", "cosine"), "crossing_layer"] == 4
    assert c.loc[("b", "cosine"), "crossing_layer"] == 2
    assert c.loc[("a", "cosine"), "simscore_at_half"] == pytest.approx(0.6)
    meta = {"a": {"num_sequences": 64, "settings": {"max_tokens": 512}, "chat_template": True},
            "b": {"num_sequences": 64, "settings": {"max_tokens": 512}, "chat_template": False}}
    assert "plain 'User:/Assistant:' text for b" in simscore_subtitle(meta)
    fig = simscore_figure(df, subtitle=simscore_subtitle(meta))
    assert len(fig.axes) == 3 and fig.axes[0].get_title(loc="left").startswith("(a) SimScore, paper Eq. 1")
    save_figure(fig, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 10_000


def test_forward_time_figure(tmp_path):
    rows = []
    for length in (128, 256):
        for variant, l, t in (("base", 30, 1.0), ("swiftkv-l15", 15, 0.55), ("swiftkv-l8", 8, 0.3)):
            rows.append({"variant": variant, "num_key_value_layers": l, "prefill_tokens": length, "length": length,
                         "batch_size": 1, "median_s": t * length / 100, "q1_s": 0.9 * t * length / 100,
                         "q3_s": 1.1 * t * length / 100, "min_s": 0.0, "times_s": [], "speedup": 1 / t,
                         "predicted_ratio": t, "predicted_flops": 1.0})
    path = tmp_path / "smol.json"
    path.write_text(json.dumps({"model": "smol", "num_hidden_layers": 30, "dtype": "float32",
                                "hardware": {"torch_threads": 2, "cpu": "cpu"}, "settings": {"repeats": 5},
                                "results": rows}))
    df = read_prefill_time([path])
    assert "float32, 2 torch threads, median of 5" in forward_time_title(df)
    fig = forward_time_figure(df, forward_time_title(df))
    ratio_lines = [ln for ln in fig.axes[1].get_lines() if ln.get_linestyle() == "--"]
    assert len(ratio_lines) == 3
    np.testing.assert_allclose(sorted(ln.get_ydata()[0] for ln in ratio_lines), [0.3, 0.55, 1.0])
    save_figure(fig, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 10_000


def test_table1_joins_the_paper(tmp_path):
    rec = {"model": "llama-3.1-70b-instruct", "config": "x", "context_length": 1,
           "table1": [{"setting": "Baseline", "skip": 0.0, "model_type": "llama", "num_hidden_layers": 80,
                       "num_key_value_layers": 80, "key_value_group_size": 1, "context_length": 1, "vocab": 4.2,
                       "kv_proj": 2.7, "qo_proj": 21.5, "mlp": 112.7, "attention": 160.4, "total": 301.5,
                       "prefill_reduction": 0.0}],
           "kv_memory": [{"model_type": "llama", "num_hidden_layers": 32, "num_key_value_layers": 16,
                          "key_value_group_size": 4, "skip": 0.5, "kv_cache_layers": 20.0,
                          "kv_cache_bytes_per_token": 81920.0, "kv_cache_bytes_per_token_fp8": 40960.0,
                          "kv_cache_reduction": 0.375, "kv_cache_reduction_fp8": 0.6875}]}
    path = tmp_path / "m.json"
    path.write_text(json.dumps(rec))
    t = table1(read_flops([path], "table1"), paper_table("table1"))
    assert t.paper_total.tolist() == [302] and t.total.tolist() == [301.5]
    md = to_markdown(t[["model", "total"]])
    assert md.splitlines()[1] == "|---|---:|" and "| llama-3.1-70b-instruct | 302 |" in md  # 3 significant digits
    kv = kv_memory(read_flops([path], "kv_memory").assign(model="llama-3.1-8b-instruct"), paper_table("kv_memory"))
    assert kv.kv_cache_reduction.tolist() == [37.5] and kv.paper_kv_cache_reduction_fp8.tolist() == [68.75]
