"""Distil a SwiftKV student from its own teacher (paper §3.3), on accelerate.

One model plays both parts. Per step:

1. layers ``< l`` run ONCE, without autograd (nothing there trains): their output ``h_l`` is identical for teacher
   and student;
2. teacher: layers ``>= l`` the original way (``run_layers``) on ``h_l``, under ``no_grad``;
3. student: the SwiftKV K/V from ``norm_swiftkv(h_l)`` and the SwiftKV layers ``>= l`` on ``h_l``, with autograd;
4. loss on the final hidden states through the frozen LM head, chunked over positions (``swiftkv.distill.losses``):
   ``kl`` = T^2 * KL(teacher_T || student_T) (default, T = 2), ``lm`` = cross-entropy of the next token,
   ``kl+hidden`` = ``kl`` + w * MSE of the hidden state entering the last layer (the reference's later addition).

Scope ``partial`` trains ``norm_swiftkv`` and the ``*_swiftkv`` projections (teacher weights untouched, so the
teacher is the model itself with SwiftKV off); ``full`` also trains every student-used parameter of layers ``>= l``,
so the teacher's layers ``>= l`` are kept as a frozen copy.

Data: whole conversations rendered with the chat template, packed into rows of at most ``max_length`` tokens with
position ids restarting per conversation; transformers builds the attention-separated mask from those position
ids (no attention crosses conversations). By default the loss covers every real token of a pack (the paper's loss
and the early-2025 reference trainer's), not only the assistant's: the student must match the teacher wherever it
will be run, and prompts are most of what SwiftKV serves. ``loss_positions="assistant"`` is Snowflake's current
recipe: the KL over assistant tokens only, averaged over all positions.

With a teacher cache (``swiftkv.distill.teacher_cache``) steps 1-2 come from disk: the packed data, h_l and the teacher's
final hidden states were computed once for every variant, and a step runs only 3-4.

The package: ``settings`` (DistillSettings, file names), ``pair`` (the teacher/student pair and the loss), ``batches``
(packed rows, the held-out sample), ``setup`` (outputs, precision, data, schedule), ``budgets`` (the wsd plan and its
reads), ``checkpoints`` (the run log, checkpoints, gathering a sharded student), ``trainer`` (``train``: the run).
"""

from swiftkv.distill.batches import HeldOut, prepare_data
from swiftkv.distill.pair import DistillModel, DistillOutput, build_student, compute_loss, trainable_parameters
from swiftkv.distill.settings import (
                                      CHECKPOINT_FILE,
                                      LOG_FILE,
                                      LOSS_POSITIONS,
                                      LOSSES,
                                      SCHEDULES,
                                      SCOPES,
                                      SUMMARY_FILE,
                                      DistillSettings,
)
from swiftkv.distill.trainer import BudgetRead, Interrupted, RunLog, load_checkpoint, save_checkpoint, train, wsd_plan

__all__ = ["BudgetRead", "CHECKPOINT_FILE", "DistillModel", "DistillOutput", "DistillSettings", "HeldOut", "Interrupted",
           "LOG_FILE", "LOSSES", "LOSS_POSITIONS", "RunLog", "SCHEDULES", "SCOPES", "SUMMARY_FILE", "build_student",
           "compute_loss", "load_checkpoint", "prepare_data", "save_checkpoint", "train", "trainable_parameters",
           "wsd_plan"]
