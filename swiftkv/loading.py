"""Resolve a model name (embedded id, local directory or hub id) and load it."""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from swiftkv.data.assets import EMBEDDED_MODELS, model_dir
from swiftkv.errors import SwiftKVError

logger = logging.getLogger(__name__)

# files of which a local model needs one to have a tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# written by analysis.stage's restore into a run directory it re-creates with its summary and log but no weights
RESTORED_WITHOUT_WEIGHTS = "restored-without-weights.json"
# dtype names -> torch attribute names (torch is imported only when a model loads: the checks below are instant)
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}


def parse_dtype(name):
    """A dtype name (or a torch.dtype, or None) -> torch.dtype (or None)."""
    import torch

    if name is None or isinstance(name, torch.dtype):
        return name
    try:
        return getattr(torch, DTYPES[name])
    except KeyError:
        raise SwiftKVError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}") from None


def resolve_model(name: str, resources: str | os.PathLike | None = None) -> str:
    """Embedded id -> its prepared directory; an existing directory -> itself (checked: ``check_model_dir``);
    anything else -> a hub id, as is."""
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if not isinstance(name, str) or not name.strip():
        raise SwiftKVError(f"the model to load must be named: an embedded id ({', '.join(EMBEDDED_MODELS)}), a model "
                           f"directory or a hub id owner/name, not {name!r}")
    if name in EMBEDDED_MODELS:
        path = model_dir(name, resources)
        if not (path / "config.json").is_file():
            raise SwiftKVError(f"embedded model {name} is not prepared yet; run: swiftkv prepare-model {name}")
        check_model_dir(path)
        return str(path)
    if Path(name).is_dir():
        check_model_dir(Path(name))
        return name
    if Path(name).exists():
        raise SwiftKVError(f"{name} is a file; point at a model directory (with config.json), an embedded id "
                           f"({', '.join(EMBEDDED_MODELS)}) or a hub id owner/name")
    if name.count("/") != 1 or name.startswith((".", "/")):
        raise SwiftKVError(
            f"model {name!r} is neither an embedded id ({', '.join(EMBEDDED_MODELS)}), a model directory, "
            "nor a hub id of the form owner/name"
        )
    return name  # hub id: loaded the normal way where a hub is reachable


def check_model_dir(path: Path) -> None:
    """One clear line for a damaged model directory: config.json missing or not a JSON object with a model_type,
    a safetensors file that is truncated or not safetensors (read from the header: cheap)."""
    config = path / "config.json"
    if (path / RESTORED_WITHOUT_WEIGHTS).is_file():
        raise SwiftKVError(f"{path} holds a staged run's summary and log, not its weights (restored by "
                           "python -m analysis.stage); delete it and run the job that made it again (Snakemake "
                           f"does, for a target that needs {path})")
    if not config.is_file():
        raise SwiftKVError(f"{path} is a directory without config.json; point at a saved transformers model")
    try:
        values = json.loads(config.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise SwiftKVError(f"{config} is not valid JSON ({err}); the checkpoint is damaged: re-create it "
                           "(swiftkv convert / distill) or restore the file") from None
    if not isinstance(values, dict) or "model_type" not in values:
        raise SwiftKVError(f"{config} has no model_type; it is not a transformers model config")
    from safetensors import SafetensorError, safe_open

    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise SwiftKVError(f"{weights} is damaged ({str(err).splitlines()[0]}); re-create the checkpoint "
                               "(swiftkv convert / distill) or copy the file again") from None


def checkpoint_keys(path: Path) -> set[str]:
    """The tensor names a local safetensors checkpoint holds (read from the file headers: no weights are loaded)."""
    from safetensors import safe_open

    keys = set()
    for weights in sorted(path.glob("*.safetensors")):
        with safe_open(str(weights), framework="pt") as f:
            keys.update(f.keys())
    return keys


def check_swiftkv_weights(path: Path, model_class, config) -> None:
    """One line, before any weight is read, when a local SwiftKV checkpoint lacks a ``*_swiftkv`` tensor that its
    config (l, g, the family) implies, or holds one it has no place for: the names of a model built on the meta
    device from the config against those in the files."""
    import torch

    on_disk = {k for k in checkpoint_keys(path) if "_swiftkv" in k}
    if not on_disk and not any(path.glob("*.safetensors")):
        return  # other weight formats: checked by the loader
    with torch.device("meta"):
        expected = {k for k in model_class(config).state_dict() if "_swiftkv" in k}
    missing, extra = sorted(expected - on_disk), sorted(on_disk - expected)
    if missing or extra:
        what, keys = ((f"lacks {len(missing)} of the {len(expected)} SwiftKV weights its config implies", missing)
                      if missing else (f"holds {len(extra)} SwiftKV weight(s) its config has no place for", extra))
        raise SwiftKVError(
            f"{path} {what} (l={config.num_key_value_layers}, g={config.key_value_group_size}; e.g. "
            f"{', '.join(keys[:3])}): the checkpoint is damaged or its config.json belongs to another model; "
            "re-create it (swiftkv convert / distill) or restore its files")


FINGERPRINT_ROWS = 64  # rows of each tensor compared: enough to tell models apart, cheap for any size


def frozen_fingerprint_names(config: dict) -> list[str] | None:
    """Name prefixes of the few tensors that identify a SwiftKV student's teacher: the embedding and the first and
    last of the layers below l, which distillation never changes (None for a model that is not a SwiftKV
    checkpoint)."""
    l = config.get("num_key_value_layers")
    if not str(config.get("model_type", "")).endswith("_swiftkv") or not l:
        return None
    return ["model.embed_tokens.", "model.layers.0.", f"model.layers.{l - 1}."]


def _fingerprint_of(name: str, prefixes: list[str]) -> bool:
    return name.startswith(tuple(prefixes)) and "_swiftkv" not in name


def _read_fingerprint(path: Path, prefixes: list[str]) -> dict:
    """The first ``FINGERPRINT_ROWS`` rows of the tensors of a local safetensors checkpoint whose names start with one
    of ``prefixes`` (SwiftKV ones left out), read lazily from the files."""
    from safetensors import safe_open

    out = {}
    for weights in sorted(path.glob("*.safetensors")):
        with safe_open(str(weights), framework="pt") as f:
            for key in f.keys():
                if _fingerprint_of(key, prefixes):
                    out[key] = f.get_slice(key)[:FINGERPRINT_ROWS]
    return out


def same_frozen_weights(student: dict, teacher: dict) -> tuple[bool, str]:
    """Whether the tensors both hold agree (to bfloat16 rounding: a checkpoint may be saved in lower precision than
    its base), and the name of the first that does not."""
    shared = sorted(set(student) & set(teacher))
    for key in shared:
        a, b = student[key].float(), teacher[key].float()
        if a.shape != b.shape or not bool(((a - b).abs() <= 1e-2 * b.abs() + 1e-6).all()):
            return False, key
    return bool(shared), shared[0] if shared else ""


def _check_base(name: str, base: str, student: dict, base_vocab, fingerprints) -> None:
    """``base`` must have ``name``'s vocabulary and, for a SwiftKV student, its frozen weights: ``fingerprints(prefixes)``
    gives (student's, base's) tensors."""
    if student.get("vocab_size") != base_vocab:
        raise SwiftKVError(f"--base {base} has a vocabulary of {base_vocab} tokens and {name} one of "
                           f"{student.get('vocab_size')}: it cannot be its teacher; give the base model {name} was "
                           "converted from")
    prefixes = frozen_fingerprint_names(student)
    if prefixes is None:
        return
    same, key = same_frozen_weights(*fingerprints(prefixes))
    if not same and key:
        raise SwiftKVError(f"--base {base} is not the model {name} was made from: its {key} differs from the "
                           f"student's, which distillation never changes (layers below l="
                           f"{student['num_key_value_layers']}); give the base model it was converted from")


def check_base_model(name: str, base: str, resources: str | os.PathLike | None = None) -> None:
    """One line, before any model is loaded, when ``base`` cannot be the teacher of ``name``: another vocabulary, or
    (``name`` a SwiftKV checkpoint) other weights below l than the student's frozen ones, compared on a few rows of a
    few tensors read from the files. Local models only; a hub id is checked once loaded (``check_base_loaded``)."""
    student, teacher = local_config(name, resources), local_config(base, resources)
    if student is None or teacher is None:
        return
    _check_base(name, base, student, teacher.get("vocab_size"),
                lambda prefixes: (_read_fingerprint(Path(resolve_model(name, resources)), prefixes),
                                  _read_fingerprint(Path(resolve_model(base, resources)), prefixes)))


def check_base_loaded(model, teacher, name: str, base: str) -> None:
    """``check_base_model`` on loaded models (for hub ids, known only once loaded)."""

    def rows(m, prefixes) -> dict:
        return {k: v[:FINGERPRINT_ROWS] for k, v in m.state_dict().items() if _fingerprint_of(k, prefixes)}

    _check_base(name, base, model.config.to_dict(), teacher.config.vocab_size,
                lambda prefixes: (rows(model, prefixes), rows(teacher, prefixes)))


def local_config(name: str, resources: str | os.PathLike | None = None) -> dict | None:
    """The (checked) config.json of a local or embedded model as a dict; None for a hub id (known once loaded)."""
    source = resolve_model(name, resources)
    return json.loads((Path(source) / "config.json").read_text()) if Path(source).is_dir() else None


def check_student_shape(name: str, resources, num_key_value_layers: int | None, key_value_group_size: int | None,
                        key_value_heads: int | None = None) -> None:
    """l, g (and MQA heads) against the model's config.json before any weights load: one line if they do not fit."""
    from types import SimpleNamespace

    from swiftkv.configuration import validate_swiftkv_config

    config = local_config(name, resources)
    if config is None or num_key_value_layers is None:
        return
    validate_swiftkv_config(SimpleNamespace(
        num_hidden_layers=config["num_hidden_layers"], num_key_value_layers=num_key_value_layers,
        key_value_group_size=1 if key_value_group_size is None else key_value_group_size,
        swiftkv_key_value_heads=key_value_heads,
        num_attention_heads=config.get("num_attention_heads"),
        num_key_value_heads=config.get("num_key_value_heads") or config.get("num_attention_heads")))


def require_swiftkv_checkpoint(name: str, resources: str | os.PathLike | None, option: str) -> None:
    """One line, before any loading, when ``option`` (e.g. --teacher) is given for a model that is not a SwiftKV
    checkpoint (local directories and embedded ids; a hub id is checked once it is loaded)."""
    config = local_config(name, resources)
    if config is None:
        return
    model_type = config.get("model_type", "")
    if not model_type.endswith("_swiftkv"):
        raise SwiftKVError(f"{option} needs a SwiftKV checkpoint; {name} is a {model_type} model, which always runs "
                           f"as itself (drop {option})")


def hub_reachable(timeout: float = 3.0) -> bool:
    """False when the hub is switched off (HF_HUB_OFFLINE) or its host cannot be reached within ``timeout``:
    checked once, so that an offline machine gets one line at once instead of retries."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout):
            return True
    except OSError:
        return False


def load_model(
    name: str,
    dtype="float32",
    resources: str | os.PathLike | None = None,
    attn_implementation: str | None = None,
    require_tokenizer: bool = True,
    meta: bool = False,
    **kwargs,
):
    """Load (model, tokenizer) for ``name``; SwiftKV checkpoints load as SwiftKV models (``import swiftkv``).

    A local model without tokenizer files is refused in one line, unless ``require_tokenizer`` is False (commands
    that only rewrite weights): the tokenizer is then None. ``meta``: the model is built from its config on the meta
    device, without reading a weight (the ranks other than 0 of a sharded distillation: rank 0 sends the shards)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import swiftkv  # noqa: F401  (registers the SwiftKV model types)

    source = resolve_model(name, resources)
    extra = dict(kwargs)
    if attn_implementation:
        extra["attn_implementation"] = attn_implementation
    hub = source == name and not Path(name).is_dir()
    if hub and not hub_reachable():
        extra["local_files_only"] = True  # offline: only a copy in the local cache can load
    no_tokenizer = not hub and not any((Path(source) / f).is_file() for f in TOKENIZER_FILES)
    if no_tokenizer and require_tokenizer:
        raise SwiftKVError(f"{name} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); copy the tokenizer files "
                           "of the model it was made from into it")
    files = {k: v for k, v in extra.items() if k == "local_files_only"}  # what reading a config or tokenizer takes
    try:
        if meta:
            import torch
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(source, **files)
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, dtype=parse_dtype(dtype) or config.dtype,
                                                         **{k: v for k, v in extra.items() if k not in files})
        else:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=parse_dtype(dtype), **extra)
        tokenizer = None if no_tokenizer else AutoTokenizer.from_pretrained(source, **files)
    except ValueError as err:  # e.g. a tokenizer that needs a package not installed here
        if isinstance(err, SwiftKVError):
            raise
        raise SwiftKVError(f"could not load {name}: {str(err).strip().splitlines()[0]}") from None
    except OSError as err:
        if hub:
            why = "the hub is unreachable and it is not in the local cache" if extra.get("local_files_only") else \
                str(err).splitlines()[0]
            raise SwiftKVError(
                f"could not load {name!r} from the hub ({why}); without a hub, use an embedded model or a local "
                "directory"
            ) from None
        raise SwiftKVError(f"could not load the model in {source}: {str(err).splitlines()[0]}") from None
    model.eval()
    return model, tokenizer
