"""Models for speed benchmarks: anything ``load_model`` takes, or a config JSON (random weights, no hub needed).

Speed does not depend on the weights, so a paper-sized model can be timed from its ``config.json`` alone
(``config/models/llama-3.1-8b-instruct.json``): the weights are initialised randomly, directly on the device.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from swiftkv.errors import SwiftKVError

logger = logging.getLogger(__name__)


def is_config_file(name: str) -> bool:
    return name.endswith(".json") and Path(name).is_file()


def check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SwiftKVError(f"--device {device} asked for, but torch sees no CUDA GPU here; use --device cpu")


def load_bench_model(name: str, dtype: torch.dtype, device: str = "cpu", resources=None, seed: int = 0):
    """(model, tokenizer or None) on ``device``; a ``*.json`` config gives random weights and no tokenizer."""
    check_device(device)
    if is_config_file(name):
        from transformers import AutoConfig, AutoModelForCausalLM

        import swiftkv  # noqa: F401  (SwiftKV configs load too)

        config = AutoConfig.from_pretrained(name)
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        logger.info("random-weight %s from %s: %.2fB parameters, %s on %s", config.model_type, name,
                    sum(p.numel() for p in model.parameters()) / 1e9, dtype, device)
        return model.eval(), None
    from swiftkv.loading import load_model

    model, tokenizer = load_model(name, dtype=dtype, resources=resources)
    return model.to(device), tokenizer
