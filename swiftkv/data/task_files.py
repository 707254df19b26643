"""The data files of lm-eval task YAMLs that swiftkv writes (BIG-bench / MMLU tasks, the held-out perplexity task):
how a YAML names its data so that a task folder still evaluates after results/ is copied to another checkout, and a
check, before lm-eval starts, that every data file a folder's YAMLs name is there."""

from __future__ import annotations

from pathlib import Path

import yaml


def data_file_path(data_file: Path) -> str:
    """How a task YAML names its data file: relative to the working directory when the file lies under it (the
    workflow runs from the repository root, so a results/ folder copied to another checkout, or a checkout moved,
    still finds its data), absolute otherwise. lm-eval hands the path to ``datasets.load_dataset``, which reads a
    relative path from the working directory."""
    path, cwd = data_file.resolve(), Path.cwd().resolve()
    return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)


def missing_data_files(folders: list[str | Path]) -> list[str]:
    """The task YAMLs in ``folders`` whose ``dataset_kwargs.data_files`` name a file that is not there (from the
    working directory, as lm-eval will read it): one line each, with where the file lies now if it is beside its
    YAML (the folder was moved since it was built)."""
    problems = []
    for folder in folders:
        for spec in sorted(Path(folder).glob("*.yaml")):
            try:
                config = yaml.safe_load(spec.read_text()) or {}
            except yaml.YAMLError:
                continue  # not ours (lm-eval's own YAMLs may use tags); lm-eval reports its own errors
            files = ((config.get("dataset_kwargs") or {}).get("data_files") if isinstance(config, dict) else None)
            for name in (files.values() if isinstance(files, dict) else [files] if isinstance(files, str) else []):
                if not isinstance(name, str) or "://" in name or any(c in name for c in "*?["):
                    continue  # a URL or a glob: datasets resolves those itself
                if not Path(name).exists():
                    beside = spec.parent / Path(name).name
                    where = (f" (it is beside the YAML, at {beside}: the folder was built elsewhere)"
                             if beside.exists() else "")
                    problems.append(f"{spec}: data file {name} is missing{where}")
    return problems
