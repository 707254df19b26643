"""Turn a loaded base model into a SwiftKV model initialised from the teacher (reference §3)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from swiftkv.errors import SwiftKVError
from swiftkv.models import FAMILIES, SWIFTKV_MODEL_TYPES
from swiftkv.models.common import validate_swiftkv_config

logger = logging.getLogger(__name__)

# Config entries that must not travel into the SwiftKV config.
_DROP_KEYS = ("model_type", "architectures", "quantization_config", "transformers_version", "auto_map")


def swiftkv_config_from(base_config, num_key_value_layers: int, key_value_group_size: int = 1, **extra):
    """The SwiftKV config of ``base_config``'s family with l, g set and ``swiftkv=True``."""
    model_type = getattr(base_config, "model_type", None)
    if model_type in SWIFTKV_MODEL_TYPES:
        raise SwiftKVError(f"the model is already a SwiftKV model ({model_type}); convert its base model instead")
    family = FAMILIES.get(model_type)
    if family is None:
        raise SwiftKVError(
            f"unknown model family {model_type!r}: SwiftKV supports {', '.join(sorted(FAMILIES))}; "
            "add a family module under swiftkv/models to support it"
        )
    values = {k: v for k, v in base_config.to_dict().items() if k not in _DROP_KEYS}
    values.update(
        swiftkv=True,
        num_key_value_layers=num_key_value_layers,
        key_value_group_size=key_value_group_size,
        architectures=[family.model_class.__name__],
        **extra,
    )
    probe = type("Probe", (), {"num_hidden_layers": base_config.num_hidden_layers,
                               "num_key_value_layers": num_key_value_layers,
                               "key_value_group_size": key_value_group_size})
    validate_swiftkv_config(probe)  # one clear line before building anything
    config = family.config_class(**values)
    config._attn_implementation = base_config._attn_implementation
    return config


@torch.no_grad()
def convert_to_swiftkv(
    model, num_key_value_layers: int, key_value_group_size: int = 1, key_value_heads: int | None = None
):
    """Return a SwiftKV model (student mode on) that shares every teacher weight of ``model``.

    - ``q_proj_swiftkv`` of each layer >= l starts as a copy of that layer's ``q_proj``;
    - ``k/v_proj_swiftkv`` of each AcrossKV group leader start as the mean of the group's ``k/v_proj``;
    - ``norm_swiftkv`` starts as a copy of ``layers[l].input_layernorm``;
    - Qwen3: ``q_norm_swiftkv`` starts as a copy of the layer's ``q_norm``, ``k_norm_swiftkv`` as the group's mean
      ``k_norm``;
    - DeepSeek-V2 (latent attention): the query path is copied, each part of a leader's latent K/V path is the
      group's mean (``_init_mla``).
    - ``key_value_heads`` (MQA student, paper Table B.2): the SwiftKV K/V of layers >= l get that many KV heads,
      each initialised as the mean of the teacher KV heads it replaces (consecutive heads, so every query head
      keeps reading the pool of the heads it read before); the cache of those layers shrinks accordingly.

    Only ``norm_swiftkv`` and the ``*_swiftkv`` projections require grad afterwards.
    """
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        hint = f"load it first: model, tokenizer = swiftkv.loading.load_model({model!r}); " if isinstance(
            model, str) else ""
        raise SwiftKVError(f"convert_to_swiftkv takes a loaded transformers model, not a {type(model).__name__}; "
                           f"{hint}then convert_to_swiftkv(model, l, g)")
    l, g = num_key_value_layers, key_value_group_size
    if key_value_heads is not None and getattr(model.config, "kv_lora_rank", None):
        raise SwiftKVError("an MQA-style student (fewer KV heads) is not defined for latent attention (DeepSeek-V2), "
                           "whose cache holds one latent per token; use AcrossKV (-g) instead")
    extra = {} if key_value_heads is None else {"swiftkv_key_value_heads": key_value_heads}
    config = swiftkv_config_from(model.config, l, g, **extra)
    family = FAMILIES[model.config.model_type]
    with torch.device("meta"):
        student = family.model_class(config)
    # Teacher weights are shared, not copied: assign the base model's tensors to the new modules.
    missing, unexpected = student.load_state_dict(model.state_dict(), strict=False, assign=True)
    if unexpected:
        raise SwiftKVError(f"unexpected weights while converting: {unexpected[:3]}...; is this a {family.base_model_type} model?")
    for name, buf in model.named_buffers():
        _set_by_name(student, name, buf)
    student.tie_weights()
    ref = model.model.embed_tokens.weight
    layers = student.model.layers
    for i in range(l, config.num_hidden_layers):
        attn = layers[i].self_attn
        if hasattr(attn, "kv_a_proj_with_mqa"):  # DeepSeek-V2's latent attention
            _init_mla(attn, [layers[j].self_attn for j in range(i, i + g)] if (i - l) % g == 0 else None)
            continue
        attn.q_proj_swiftkv = _copy_linear(attn.q_proj, ref)
        if hasattr(attn, "q_norm"):  # Qwen3: the per-head query norm, copied
            attn.q_norm_swiftkv.weight = nn.Parameter(attn.q_norm.weight.detach().clone())
        if (i - l) % g == 0:
            group = [layers[j].self_attn for j in range(i, i + g)]
            attn.k_proj_swiftkv = _mean_linear([a.k_proj for a in group], ref, attn.head_dim, key_value_heads)
            attn.v_proj_swiftkv = _mean_linear([a.v_proj for a in group], ref, attn.head_dim, key_value_heads)
            if hasattr(attn, "k_norm"):  # Qwen3: the per-head key norm, the group's mean like k/v_proj
                weight = torch.stack([a.k_norm.weight.float() for a in group]).mean(0).to(ref.dtype)
                attn.k_norm_swiftkv.weight = nn.Parameter(weight)
    norm = student.model.norm_swiftkv
    source = layers[l].input_layernorm if l < config.num_hidden_layers else student.model.norm
    norm.weight = nn.Parameter(source.weight.detach().clone())
    still_meta = [n for n, p in student.named_parameters() if p.is_meta] + [n for n, b in student.named_buffers() if b.is_meta]
    if still_meta and not any(p.is_meta for p in model.parameters()):  # (a base on meta: a sharded run's other ranks)
        raise RuntimeError(f"conversion left uninitialised tensors: {still_meta[:5]}")
    set_trainable(student, "partial")
    student.generation_config = model.generation_config
    student.eval()
    return student


ARCTIC_INFERENCE_TYPES = ("llama_swiftkv",)  # what Snowflake's vLLM plugin serves


@torch.no_grad()
def expand_acrosskv(model):
    """The same student with its own ``k/v_proj_swiftkv`` (and, in Qwen3, ``k_norm_swiftkv``) in every layer >= l,
    copies of its AcrossKV group leader's, and ``key_value_group_size = 1``: what a loader that ignores the group size
    and expects those weights in every later layer reads (Snowflake's arctic-inference). Every logit is unchanged;
    the KV cache is no longer shared across layers, so AcrossKV's memory saving is lost."""
    import copy

    from swiftkv.models.common import group_leader

    cfg = model.config
    _require_swiftkv(cfg.model_type)
    if getattr(cfg, "swiftkv_key_value_heads", None):
        raise SwiftKVError("an MQA-style student (swiftkv_key_value_heads) has no form with one K/V per layer here; "
                           "serve it with transformers")
    l, L = cfg.num_key_value_layers, cfg.num_hidden_layers
    state = dict(model.state_dict())
    for i in range(l, L):
        leader = group_leader(i, cfg)
        if i == leader:
            continue
        for name in ("k_proj_swiftkv", "v_proj_swiftkv", "k_norm_swiftkv",  # and DeepSeek-V2's latent path
                     "kv_a_proj_with_mqa_swiftkv", "kv_a_layernorm_swiftkv", "kv_b_proj_swiftkv"):
            for part in ("weight", "bias"):
                key = f"model.layers.{leader}.self_attn.{name}.{part}"
                if key in state:
                    state[f"model.layers.{i}.self_attn.{name}.{part}"] = state[key].clone()
    config = copy.deepcopy(cfg)
    config.key_value_group_size = 1
    family = next(f for f in FAMILIES.values() if f.model_type == cfg.model_type)
    with torch.device("meta"):
        out = family.model_class(config)
    out.load_state_dict(state, strict=True, assign=True)
    for name, buf in model.named_buffers():
        _set_by_name(out, name, buf)
    out.tie_weights()
    out.generation_config = model.generation_config
    return out.eval()


def _require_swiftkv(kind: str) -> None:
    if kind not in SWIFTKV_MODEL_TYPES:
        raise SwiftKVError(f"{kind!r} is not a SwiftKV checkpoint; convert (and distil) a base model first")


def check_arctic_inference_type(kind: str) -> None:
    """Refuse, in one line, a checkpoint type that Snowflake's vLLM plugin cannot serve."""
    _require_swiftkv(kind)
    if kind not in ARCTIC_INFERENCE_TYPES:
        raise SwiftKVError(f"arctic-inference serves {', '.join(ARCTIC_INFERENCE_TYPES)} checkpoints only, not {kind}; "
                           "serve this one with our vLLM plugin (swiftkv.vllm_plugin) or transformers")


def export_arctic_inference(model, tokenizer, output, overwrite: bool = False) -> str | None:
    """Write ``model`` (a Llama SwiftKV checkpoint) as Snowflake's vLLM plugin loads it: ``expand_acrosskv``, then
    the usual checkpoint. Returns the note to show the user (AcrossKV's saving lost), or None."""
    check_arctic_inference_type(model.config.model_type)
    g = model.config.key_value_group_size
    save_model_dir(expand_acrosskv(model), tokenizer, output, overwrite=overwrite,
                   what="arctic-inference checkpoint")
    if g == 1:
        return None
    return (f"note: the {g}-way AcrossKV groups were expanded into one K/V per layer (arctic-inference ignores "
            "key_value_group_size): outputs are unchanged, but the served KV cache is no smaller than SwiftKV's alone")


def set_trainable(model, scope: str = "partial") -> list[str]:
    """Freeze everything except the trained part; return the names of trainable parameters.

    ``partial``: ``norm_swiftkv`` and the ``*_swiftkv`` projections (the paper's choice);
    ``full``: additionally every parameter of layers >= l (paper Table 4b).
    """
    if scope not in ("partial", "full"):
        raise SwiftKVError(f"unknown training scope {scope!r}; use 'partial' or 'full'")
    l = model.config.num_key_value_layers
    names = []
    for name, param in model.named_parameters():
        train = "swiftkv" in name
        if scope == "full" and name.startswith("model.layers."):
            train = train or int(name.split(".")[2]) >= l
        param.requires_grad_(train)
        if train:
            names.append(name)
    return names


def _init_mla(attn, group: list | None) -> None:
    """DeepSeek-V2: the student's query path copies the layer's own (``q_proj`` or the query LoRA); a group leader's
    latent path (``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``) starts as the group's mean of each."""
    import copy

    from swiftkv.models.deepseek_v2 import MLA_KV, MLA_QUERY

    for name in MLA_QUERY:
        if getattr(attn, name, None) is not None:
            setattr(attn, f"{name}_swiftkv", copy.deepcopy(getattr(attn, name)))
    for name in MLA_KV if group else ():
        module = copy.deepcopy(getattr(group[0], name))
        for pname, param in module.named_parameters():
            stacked = torch.stack([dict(getattr(a, name).named_parameters())[pname].float() for a in group])
            param.data = stacked.mean(0).to(param.dtype)
        setattr(attn, f"{name}_swiftkv", module)


def _copy_linear(src: nn.Linear, like: torch.Tensor) -> nn.Linear:
    out = nn.Linear(src.in_features, src.out_features, bias=src.bias is not None, device=like.device, dtype=like.dtype)
    out.weight.copy_(src.weight)
    if src.bias is not None:
        out.bias.copy_(src.bias)
    return out


def _mean_linear(
    srcs: list[nn.Linear], like: torch.Tensor, head_dim: int | None = None, heads: int | None = None
) -> nn.Linear:
    """Mean of ``srcs`` (the layers of an AcrossKV group); with ``heads``, also mean-pooled down to that many heads."""
    first = srcs[0]
    weight = torch.stack([s.weight.float() for s in srcs]).mean(0)  # n_kv*D, H
    bias = torch.stack([s.bias.float() for s in srcs]).mean(0) if first.bias is not None else None
    if heads is not None:
        n_kv = first.out_features // head_dim
        weight = weight.view(heads, n_kv // heads, head_dim, -1).mean(1).reshape(heads * head_dim, -1)  # heads*D, H
        if bias is not None:
            bias = bias.view(heads, n_kv // heads, head_dim).mean(1).reshape(-1)
    out = nn.Linear(first.in_features, weight.shape[0], bias=bias is not None, device=like.device, dtype=like.dtype)
    out.weight.copy_(weight)
    if bias is not None:
        out.bias.copy_(bias)
    return out


def _set_by_name(root: nn.Module, dotted: str, buf: torch.Tensor) -> None:
    *path, leaf = dotted.split(".")
    mod = root
    for p in path:
        mod = getattr(mod, p)
    persistent = leaf not in getattr(mod, "_non_persistent_buffers_set", set())
    mod.register_buffer(leaf, buf, persistent=persistent)


def save_model_dir(model, tokenizer, output, files: dict | None = None, overwrite: bool = False,
                   what: str = "checkpoint", inputs=()) -> None:
    """``save_pretrained`` (Snowflake's format for SwiftKV models) + tokenizer + extra ``files`` (name -> text or
    a Path to copy) as one atomic directory write (``swiftkv.io.atomic_dir``: refuses a directory it did not write,
    or another kind of output, unless ``overwrite``, and never writes over ``inputs`` or the directory ``model`` was
    loaded from). ``model`` or ``tokenizer`` None: not written."""
    import shutil
    from pathlib import Path

    from swiftkv.io import atomic_dir

    source = getattr(model, "name_or_path", None) if model is not None else None
    inputs = [*inputs, *([source] if isinstance(source, str) and source and Path(source).is_dir() else [])]
    with atomic_dir(output, overwrite=overwrite, what=what, inputs=inputs) as tmp:
        if model is not None:
            model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, content in (files or {}).items():
            if isinstance(content, Path):
                shutil.copyfile(content, tmp / name)
            else:
                (tmp / name).write_text(content)
