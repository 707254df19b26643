"""The teacher/student pair of one model: the shared forward below l, the two sides above it, and the loss."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from swiftkv.distill.losses import distill_kl, lm_cross_entropy
from swiftkv.distill.settings import DistillSettings


@dataclass
class DistillOutput:
    student: torch.Tensor  # B,S,H final (normed) hidden states of the student, with autograd
    teacher: torch.Tensor  # B,S,H final (normed) hidden states of the teacher, no autograd
    student_pre_last: torch.Tensor | None = None  # B,S,H stream entering the last layer (kl+hidden only)
    teacher_pre_last: torch.Tensor | None = None


class DistillModel(nn.Module):
    """A SwiftKV model as teacher and student, sharing the layers below l. ``forward`` returns both final hidden
    states; the LM head stays outside (the chunked losses apply it)."""

    def __init__(self, model: nn.Module, scope: str = "partial", keep_pre_last: bool = False,
                 teacher_cached: bool = False):
        super().__init__()
        self.model = model
        self.keep_pre_last = keep_pre_last
        cfg = model.config
        self.l, self.L = cfg.num_key_value_layers, cfg.num_hidden_layers
        # full scope trains the student's layers >= l: the teacher keeps a frozen copy of the originals (not needed
        # when the teacher's outputs come from a teacher cache)
        self.teacher_layers = None
        if scope == "full" and not teacher_cached:
            self.teacher_layers = nn.ModuleList(copy.deepcopy(model.model.layers[i]) for i in range(self.l, self.L))
            self.teacher_layers.requires_grad_(False)

    @property
    def inner(self):
        return self.model.model

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, boundary: torch.Tensor | None = None,
                teacher: torch.Tensor | None = None, teacher_pre_last: torch.Tensor | None = None,
                state=None, prepare: bool = False) -> DistillOutput | tuple:
        """Both models on a batch; with ``boundary`` (h_l) and ``teacher`` from a teacher cache only the student's
        layers >= l run (the masks and rotary embeddings still come from the batch's position ids); with a prepared
        ``state`` and ``boundary`` (the held-out sample) only the student's layers >= l, nothing else. ``prepare``:
        the held-out sample's fixed part, (state, boundary, teacher), without the student (through ``forward``, so
        that under FSDP the embeddings are gathered like in every other call)."""
        if prepare:
            if boundary is None:
                state, boundary = self.prefix(input_ids, position_ids)
                teacher, _ = self.teacher_upper(state, boundary)
            else:
                with torch.no_grad():
                    state = self.inner.prepare_prefix(input_ids=input_ids, position_ids=position_ids, use_cache=False)
            return state, boundary, teacher
        if state is not None:
            student, student_pre = self.student_upper(state, boundary)
            return DistillOutput(student, teacher, student_pre, teacher_pre_last)
        if boundary is None:
            state, boundary = self.prefix(input_ids, position_ids)
            return self.upper(state, boundary)
        state = self.inner.prepare_prefix(input_ids=input_ids, position_ids=position_ids, use_cache=False)
        student, student_pre = self.student_upper(state, boundary)
        return DistillOutput(student, teacher, student_pre, teacher_pre_last)

    @torch.no_grad()
    def prefix(self, input_ids, position_ids):
        """Layers < l, once for both (no autograd: nothing there trains). Returns (PrefixState, h_l)."""
        state = self.inner.prepare_prefix(input_ids=input_ids, position_ids=position_ids, use_cache=False)
        return state, self.inner.run_layers(state, 0, self.l)

    def upper(self, state, boundary: torch.Tensor) -> DistillOutput:
        teacher, teacher_pre = self.teacher_upper(state, boundary)
        student, student_pre = self.student_upper(state, boundary)
        return DistillOutput(student, teacher, student_pre, teacher_pre)

    @torch.no_grad()
    def teacher_upper(self, state, boundary):
        inner, hidden, pre_last = self.inner, boundary, None
        layers = self.teacher_layers if self.teacher_layers is not None else inner.layers[self.l:]
        for i, layer in zip(range(self.l, self.L), layers):
            if i == self.L - 1:
                pre_last = hidden
            hidden = layer(
                hidden,
                attention_mask=state.masks[inner.layer_type(i)],
                position_embeddings=state.position_embeddings,
                position_ids=state.position_ids,
                cache=None,
                use_cache=False,
            )
        return inner.norm(hidden), pre_last

    def student_upper(self, state, boundary):
        inner, captured = self.inner, {}
        hook = None
        if self.keep_pre_last and self.l < self.L:
            def grab(module, args, kwargs):
                captured["h"] = args[0] if args else kwargs["hidden_states"]
            hook = inner.layers[self.L - 1].register_forward_pre_hook(grab, with_kwargs=True)
        try:
            key_values = inner.swiftkv_key_values(boundary, state)
            hidden = inner.run_swiftkv_layers(
                boundary, key_values, state.masks, state.position_embeddings, state.position_ids
            )
        finally:
            if hook is not None:
                hook.remove()
        return inner.norm(hidden), captured.get("h")


def compute_loss(out: DistillOutput, batch: dict, head: nn.Module, settings: DistillSettings,
                 counted: torch.Tensor | None = None) -> torch.Tensor:
    """Mean loss per counted position: every real token for kl / kl+hidden, tokens with a next token for lm.

    ``loss_positions="assistant"`` (Snowflake's current recipe) sums the KL (or cross-entropy) over assistant tokens
    only and still divides by every counted position; the hidden-state MSE stays over every position.
    ``counted``: the divisor (one rank's share of a global batch: the global batch's counted positions)."""
    every = batch["labels"] >= 0 if settings.loss == "lm" else batch["loss_mask"]
    n = every.sum().clamp(min=1) if counted is None else counted
    sel = every & batch["assistant_mask"] if settings.loss_positions == "assistant" else every
    if settings.loss == "lm":
        return lm_cross_entropy(out.student[sel], batch["labels"][sel], head, settings.chunk_size) / n
    loss = distill_kl(out.student[sel], out.teacher[sel], head, settings.temperature, settings.chunk_size) / n
    if settings.loss == "kl+hidden" and out.student_pre_last is not None:
        s, t = out.student_pre_last[every].float(), out.teacher_pre_last[every].float()
        if counted is None:
            mse = F.mse_loss(s, t)
        else:  # a share of the global batch's mean
            mse = F.mse_loss(s, t, reduction="sum") / (counted * s.shape[-1])
        loss = loss + settings.hidden_weight * mse
    return loss


def build_student(base_model, settings: DistillSettings):
    """Convert the base model (reference init; MQA heads mean-pooled) and set what trains."""
    from swiftkv.models.convert import convert_to_swiftkv, set_trainable

    student = convert_to_swiftkv(
        base_model, settings.num_key_value_layers, settings.key_value_group_size, settings.key_value_heads
    )
    if settings.scope == "full":
        set_trainable(student, "full")
        # the student never uses the teacher's q/k/v projections of layers >= l: keep them frozen (and original)
        l = student.config.num_key_value_layers
        for i in range(l, student.config.num_hidden_layers):
            attn = student.model.layers[i].self_attn
            for name in ("q_proj", "k_proj", "v_proj"):
                getattr(attn, name).requires_grad_(False)
    else:
        set_trainable(student, "partial")
    return student


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}
