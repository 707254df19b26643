"""One rank of a distillation on the tiny model, for tests/test_distributed.py (run under torchrun).

``python -m tests.distributed_worker SPECS`` with SPECS a JSON list of runs, done one after the other in the same
process group (one launch: the imports dominate a tiny run), each an object: ``output``, ``settings`` (DistillSettings
fields), and optionally ``strategy``, ``processes``, ``resume``, ``interrupt_after``, ``gradient_checkpointing``,
``micro_batch_size``, ``teacher_cache``, ``meta`` (the ranks other than 0 build the model on the meta device, as
``swiftkv distill`` does under FSDP: their shards come from rank 0), ``tied`` (the embeddings and the LM head share
one weight, as in SmolLM2),
``kill`` ([rank, step]: that rank kills itself with SIGKILL when step ``step`` is checked), ``poison`` ([rank, step]: a NaN
in that rank's shard of a trainable weight before the weight check at that step), ``late`` ([rank, seconds]: that
rank starts the run that much after the others, as a loaded machine makes it). Errors are reported the
way the CLI reports them (one line, exit status 1 or 2)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys

import torch


def main(specs: list[dict]) -> int:
    for spec in specs:
        status = run(spec)
        if status not in (0, 3):  # 3: interrupted on purpose (a --resume test)
            return status
    return 0


def run(spec: dict) -> int:
    from swiftkv.cli.distill import one_line_rank_failures
    from swiftkv.distill import DistillSettings, Interrupted, train
    from swiftkv.distill.guards import DivergenceGuard
    from swiftkv.errors import SwiftKVError, print_error
    from tests.conftest import tiny_base, tiny_conversations, tiny_tokenizer

    torch.set_num_threads(1)
    if spec.get("late") and int(os.environ["RANK"]) == spec["late"][0]:
        import time

        time.sleep(spec["late"][1])
    if spec.get("kill") and int(os.environ["RANK"]) == spec["kill"][0]:
        check_step = DivergenceGuard.check_step

        def dying(self, step, loss, grad_norm=None):
            if step == spec["kill"][1]:
                os.kill(os.getpid(), signal.SIGKILL)
            return check_step(self, step, loss, grad_norm)

        DivergenceGuard.check_step = dying
    if spec.get("poison") and int(os.environ["RANK"]) == spec["poison"][0]:
        from swiftkv.distill.parallel import local_tensor

        check_weights = DivergenceGuard.check_weights

        def poisoned(self, step, params, checkpoint=False):
            if step == spec["poison"][1]:  # a NaN in this rank's shard only
                with torch.no_grad():
                    local_tensor(params[0]).view(-1)[0] = float("nan")
            return check_weights(self, step, params, checkpoint)

        DivergenceGuard.check_weights = poisoned
    try:
        with one_line_rank_failures():
            cached = spec.get("teacher_cache")  # the data and the teacher's side come from it
            meta = spec.get("meta") and int(os.environ["RANK"]) != 0
            with torch.device("meta") if meta else contextlib.nullcontext():
                base = tiny_base(num_hidden_layers=4, tie_word_embeddings=bool(spec.get("tied")))
            train(base, tiny_tokenizer(), DistillSettings(**spec["settings"]),
                  spec["output"], train_conversations=None if cached else tiny_conversations(120),
                  heldout_conversations=None if cached else tiny_conversations(15, 1, "h"), teacher_cache=cached,
                  progress=False, mixed_precision="no",
                  strategy=spec.get("strategy"), processes=spec.get("processes"), resume=spec.get("resume", False),
                  interrupt_after=spec.get("interrupt_after"),
                  gradient_checkpointing=spec.get("gradient_checkpointing", False),
                  micro_batch_size=spec.get("micro_batch_size"))
    except Interrupted:
        return 3
    except SwiftKVError as err:
        print_error(str(err))
        return getattr(err, "exit_status", 2)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
