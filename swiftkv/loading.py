"""Resolve a model name (embedded id, local directory or hub id) and load it."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from swiftkv.assets import EMBEDDED_MODELS, model_dir
from swiftkv.errors import SwiftKVError

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    if name is None or isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise SwiftKVError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}") from None


def resolve_model(name: str, resources: str | os.PathLike | None = None) -> str:
    """Embedded id -> its prepared directory; an existing directory -> itself; anything else -> a hub id, as is."""
    if name in EMBEDDED_MODELS:
        path = model_dir(name, resources)
        if not (path / "config.json").is_file():
            raise SwiftKVError(f"embedded model {name} is not prepared yet; run: swiftkv prepare-model {name}")
        return str(path)
    if Path(name).is_dir():
        if not (Path(name) / "config.json").is_file():
            raise SwiftKVError(f"{name} is a directory without config.json; point at a saved transformers model")
        return name
    if name.count("/") != 1 or name.startswith((".", "/")):
        raise SwiftKVError(
            f"model {name!r} is neither an embedded id ({', '.join(EMBEDDED_MODELS)}), a model directory, "
            "nor a hub id of the form owner/name"
        )
    return name  # hub id: loaded the normal way where a hub is reachable


def load_model(
    name: str,
    dtype: str | torch.dtype | None = "float32",
    resources: str | os.PathLike | None = None,
    attn_implementation: str | None = None,
    **kwargs,
):
    """Load (model, tokenizer) for ``name``; SwiftKV checkpoints load as SwiftKV models (``import swiftkv``)."""
    import swiftkv  # noqa: F401  (registers the SwiftKV model types)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = resolve_model(name, resources)
    extra = dict(kwargs)
    if attn_implementation:
        extra["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=parse_dtype(dtype), **extra)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except OSError as err:
        if source == name and not Path(name).is_dir():
            raise SwiftKVError(
                f"could not load {name!r} from the hub ({str(err).splitlines()[0]}); "
                "without a hub, use an embedded model or a local directory"
            ) from None
        raise
    model.eval()
    return model, tokenizer
