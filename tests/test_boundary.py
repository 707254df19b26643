"""Boundary states (swiftkv.measure.boundary): the stream entering layer l recorded by the base model's packed
evaluation and given to its SwiftKV students in place of their layers < l. A student's log-likelihoods with them equal
its own full run, on every family; a student they do not serve is refused in one line before anything runs."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from swiftkv import convert_to_swiftkv
from swiftkv.errors import SwiftKVError
from swiftkv.measure.boundary import BOUNDARY_META, BoundaryRecorder, BoundaryStates
from swiftkv.measure.lm import SwiftKVLM
from tests.conftest import tiny_base
from tests.test_evaluate import requests, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _lm(model, monkeypatch, **kwargs) -> SwiftKVLM:
    # rows of 24 positions, two rows a forward: rows hold several questions and forwards several rows
    monkeypatch.setattr("swiftkv.measure.lm.PACK_WIDTH", 24)
    return SwiftKVLM(model, tokenizer=tiny_tokenizer(), batch_size=3, max_length=24, device="cpu",
                     positions_per_forward=64, **kwargs)


def _record(base, folder, layers, monkeypatch, reqs=None, kv_cache="native"):
    recorder = BoundaryRecorder(base, layers, folder, kv_cache)
    got = _lm(base, monkeypatch, boundary_recorder=recorder, kv_cache=kv_cache)._loglikelihood_tokens(
        reqs or requests(), disable_tqdm=True)
    recorder.save()
    return got


@pytest.mark.parametrize("kv_cache", ["native", "fp8"])
@pytest.mark.parametrize("cut,group", [(2, 1), (1, 3)])
@torch.no_grad()
def test_a_student_given_its_bases_boundary_states_scores_as_it_does_alone(family, cut, group, kv_cache, tmp_path,
                                                                             monkeypatch):
    base = tiny_base(family)
    plain = _lm(base, monkeypatch, kv_cache=kv_cache)._loglikelihood_tokens(requests(), disable_tqdm=True)
    recorded = _record(base, tmp_path / "b", [1, 2], monkeypatch, kv_cache=kv_cache)
    assert recorded == plain  # recording only reads the stream: the base model's own numbers are unchanged
    student = convert_to_swiftkv(tiny_base(family), cut, group)
    alone = _lm(student, monkeypatch, kv_cache=kv_cache)
    want = alone._loglikelihood_tokens(requests(), disable_tqdm=True)
    if kv_cache == "fp8":  # the FP8 cache changes the student's numbers: states of the native cache would not do
        native = _lm(student, monkeypatch)._loglikelihood_tokens(requests(), disable_tqdm=True)
        assert max(abs(n[0] - w[0]) for n, w in zip(native, want)) > 1e-3
    given = _lm(student, monkeypatch, kv_cache=kv_cache, boundary=BoundaryStates.load(tmp_path / "b"))
    ran = []
    hooks = [layer.register_forward_hook(lambda *a: ran.append(1)) for layer in student.model.layers[:cut]]
    try:
        got = given._loglikelihood_tokens(requests(), disable_tqdm=True)
    finally:
        for hook in hooks:
            hook.remove()
    assert given.boundary_forwards == {"given": given.forwards, "run": 0} and given.forwards > 1
    assert not ran  # layers < l never ran
    assert_close(torch.tensor([g[0] for g in got]), torch.tensor([w[0] for w in want]), rtol=1e-5, atol=1e-5)
    assert [g[1] for g in got] == [w[1] for w in want]


@torch.no_grad()
def test_the_recorder_writes_shards_and_stores_each_row_once(tmp_path, monkeypatch):
    """Shards are written as the states grow (here after every forward), a row met again is not stored twice,
    and a student reads across every shard."""
    monkeypatch.setattr("swiftkv.measure.boundary.SHARD_BYTES", 1)
    base = tiny_base()
    reqs = requests()
    recorder = BoundaryRecorder(base, [2], tmp_path / "b")
    lm = _lm(base, monkeypatch, boundary_recorder=recorder)
    lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    first = recorder.rows
    lm._loglikelihood_tokens(reqs, disable_tqdm=True)  # the same rows again: nothing new to store
    recorder.save()
    states = BoundaryStates.load(tmp_path / "b")
    shards = states.meta["shards"]["2"]
    assert len(shards) == lm.forwards // 2 > 1 and recorder.rows == first >= lm.forwards // 2
    student = convert_to_swiftkv(tiny_base(), 2)
    given = _lm(student, monkeypatch, boundary=states)
    assert given._loglikelihood_tokens(reqs, disable_tqdm=True) == \
        _lm(student, monkeypatch)._loglikelihood_tokens(reqs, disable_tqdm=True)
    assert given.boundary_forwards == {"given": given.forwards, "run": 0}


@torch.no_grad()
def test_rows_the_record_lacks_run_in_full(tmp_path, monkeypatch):
    base = tiny_base()
    _record(base, tmp_path / "b", [2], monkeypatch, reqs=requests(seed=0))
    student = convert_to_swiftkv(tiny_base(), 2)
    other = requests(seed=5)
    want = _lm(student, monkeypatch)._loglikelihood_tokens(other, disable_tqdm=True)
    lm = _lm(student, monkeypatch, boundary=BoundaryStates.load(tmp_path / "b"))
    got = lm._loglikelihood_tokens(other, disable_tqdm=True)
    assert lm.boundary_forwards == {"given": 0, "run": lm.forwards}
    assert got == want


@torch.no_grad()
def test_states_that_do_not_serve_a_student_are_refused(tmp_path, monkeypatch):
    base = tiny_base()
    _record(base, tmp_path / "b", [2], monkeypatch)
    states = BoundaryStates.load(tmp_path / "b")

    def refused(model, match, **kwargs):
        with pytest.raises(SwiftKVError, match=match):
            _lm(model, monkeypatch, boundary=states, **kwargs)

    refused(convert_to_swiftkv(tiny_base(), 1), r"hold layers \[2\], not this student's cut l = 1")
    refused(convert_to_swiftkv(tiny_base(seed=1), 2), "recorded by another base model")
    other = convert_to_swiftkv(tiny_base(), 2)
    with torch.no_grad():
        other.model.layers[1].mlp.down_proj.weight[0, 0] += 1e-3  # a frozen layer changed: not the same base
    refused(other, "layers < 2 differ")
    trained = convert_to_swiftkv(tiny_base(), 2)
    with torch.no_grad():
        trained.model.layers[2].self_attn.q_proj.weight[0, 0] += 1.0  # its own part: still served
    assert _lm(trained, monkeypatch, boundary=states).boundary_layer == 2
    refused(convert_to_swiftkv(tiny_base(), 2), "FP8|fp8", kv_cache="fp8")
    refused(convert_to_swiftkv(tiny_base(), 2), "runs as a plain", teacher=True)
    refused(convert_to_swiftkv(tiny_base(), 2), "packed scorer only", scorer="chunked")
    refused(tiny_base(), "runs as a plain")
    with pytest.raises(SwiftKVError, match="recorded by the base model"):
        BoundaryRecorder(convert_to_swiftkv(tiny_base(), 2), [1], tmp_path / "c")
    with pytest.raises(SwiftKVError, match="not cuts of a 4-layer model"):
        BoundaryRecorder(base, [0, 4], tmp_path / "c")
    (tmp_path / "b" / BOUNDARY_META).write_text("{")
    with pytest.raises(SwiftKVError, match="unreadable boundary states"):
        BoundaryStates.load(tmp_path / "b")
    with pytest.raises(SwiftKVError, match="holds no boundary states"):
        BoundaryStates.load(tmp_path)


def test_the_command_line_records_with_the_base_and_a_student_reads_them(tmp_path, monkeypatch):
    """``swiftkv eval BASE --save-boundary`` then ``swiftkv eval STUDENT --boundary`` on a BIG-bench fixture task: the
    student's logged log-likelihoods equal its run without them, every forward took recorded states, the folder is
    its own output kind; ``swiftkv bench eval --scorers packed boundary`` times both and finds them equal."""
    import json

    from swiftkv.cli import main
    from swiftkv.io import read_marker
    from tests.test_evaluate import fixture_task

    base_dir, student_dir = tmp_path / "base", tmp_path / "student"
    tiny_base().save_pretrained(base_dir)
    tiny_tokenizer().save_pretrained(base_dir)
    convert_to_swiftkv(tiny_base(), 2).save_pretrained(student_dir)
    tiny_tokenizer().save_pretrained(student_dir)
    manifest = fixture_task(tmp_path)
    tasks = ["--task", "bb_fixture_report", "--include-path", str(manifest["splits"]["report"])]
    common = [*tasks, "--no-fidelity", "--dtype", "float32"]
    assert main(["eval", str(base_dir), *common, "--save-boundary", str(tmp_path / "states"), "--boundary-layers", "2",
                 "--output-dir", str(tmp_path / "e-base")]) == 0
    assert read_marker(tmp_path / "states")["kind"] == "boundary states"
    assert main(["eval", str(student_dir), *common, "--output-dir", str(tmp_path / "e-alone")]) == 0
    assert main(["eval", str(student_dir), *common, "--boundary", str(tmp_path / "states"),
                 "--output-dir", str(tmp_path / "e-given")]) == 0
    alone, given = (json.loads((tmp_path / d / "lm_eval.json").read_text()) for d in ("e-alone", "e-given"))
    used = given["swiftkv"]["boundary"]
    assert used["layer"] == 2 and used["forwards"]["run"] == 0 and used["forwards"]["given"] > 0
    for task, samples in alone["samples"].items():
        for a, b in zip(samples, given["samples"][task]):
            assert [r[0][1] for r in a["resps"]] == [r[0][1] for r in b["resps"]]
            assert_close(torch.tensor([r[0][0] for r in a["resps"]]), torch.tensor([r[0][0] for r in b["resps"]]),
                         rtol=1e-5, atol=1e-5)
    assert alone["results"] == given["results"]
    # the base model's own recording run equals its plain run, and a second recording onto the folder is refused
    assert main(["eval", str(base_dir), *common, "--save-boundary", str(tmp_path / "e-alone"), "--boundary-layers",
                 "2", "--output-dir", str(tmp_path / "e-x")]) == 2
    out = tmp_path / "bench.json"
    assert main(["bench", "eval", str(student_dir), *tasks, "--scorers", "packed", "boundary", "--boundary", str(tmp_path / "states"), "--repeats", "1",
                 "--warmup-limit", "1", "--dtype", "float32", "-o", str(out)]) == 0
    bench = json.loads(out.read_text())
    agree = bench["agreement"]["boundary"]
    assert agree["same_requests"] and agree["greedy_flags_equal"] and agree["scores_equal"]
    assert agree["max_abs_loglikelihood_diff"] < 1e-5
    assert [r["boundary_forwards"]["run"] for r in bench["runs"] if r["scorer"] == "boundary"] == [0]
    assert main(["bench", "eval", str(student_dir), *tasks, "--scorers", "packed", "boundary", "-o", str(tmp_path / "b2.json")]) == 2
