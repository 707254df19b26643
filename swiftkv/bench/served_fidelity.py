"""Served-model fidelity (issue 18, part 3): the student as our vLLM plugin serves it against the same student in
transformers, on held-out prompts, so that an engine upgrade cannot silently change what a SwiftKV model says.

Per prompt (the first user turn of a held-out ShareGPT conversation, chat template, generation prompt):

- ``greedy``: the common prefix of the two greedy continuations over the transformers continuation's length
  (1 = identical);
- ``logprob_abs``: |log p_vLLM(t) - log p_transformers(t)| of every token t vLLM generated, the transformers side
  teacher-forced on vLLM's continuation (so every token is compared, also past a divergence); max and mean;
- ``topk``: the overlap of the two top-k candidate sets at every generated position, |A ∩ B| / k.

A configuration (g; the prefill skip on or off) passes if it is within ``Tolerance`` on every measure. The defaults
are set for fp32 on both sides, before any measurement: a numerically faithful engine differs by rounding (log-probs
~1e-4), a wrong wiring (wrong K/V source, a layer skipped for a token that needs it) by whole nats.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from swiftkv.errors import SwiftKVError
from swiftkv.measure.fidelity import common_prefix, continuation_scores

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tolerance:
    """What a served configuration may differ by (fp32 on both sides)."""
    greedy_mean: float = 0.9  # mean common-prefix fraction, at least (a near-tie may flip a token, then all differ)
    logprob_max_abs: float = 0.1  # nats, at most, over every generated token of every prompt
    logprob_mean_abs: float = 0.01  # nats, at most
    topk_mean: float = 0.95  # mean top-k overlap, at least


# bf16 in vLLM (FlashAttention has no fp32) against fp32 transformers, stated before any GPU run: bf16 rounds each
# log-prob by ~1e-2 nats and near-ties flip more greedy tokens; a wrong wiring still costs whole nats.
BF16_TOLERANCE = Tolerance(greedy_mean=0.8, logprob_max_abs=1.0, logprob_mean_abs=0.05, topk_mean=0.9)


@dataclass
class ServedFidelitySettings:
    num_prompts: int = 64
    max_prompt_tokens: int = 160
    new_tokens: int = 32
    top_k: int = 5
    max_num_batched_tokens: int | None = None  # vLLM's per-step token budget (small: chunked prefill, mixed batches)
    max_num_seqs: int = 4
    dtype: str = "float32"
    attention_backend: str | None = None  # vLLM's --attention-backend (e.g. FLASH_ATTN on CUDA); None: vLLM's choice
    enforce_eager: bool = True  # False: vLLM may capture CUDA graphs (on CUDA; the plugin keeps CPU eager)
    prefill_skip: tuple[str, ...] = ("skip", "noskip")  # which of CONFIGS to serve


BLAS_THREAD_VARIABLES = ("MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                         "NUMEXPR_NUM_THREADS", "OMP_NUM_THREADS")
REPO = Path(__file__).resolve().parents[2]  # the vLLM venv imports this checkout's plugin (PYTHONPATH)
CONFIGS = (("skip", {}), ("noskip", {"SWIFTKV_VLLM_PREFILL_SKIP": "0"}))  # the prefill skip on, off


def vllm_command(python: str | Path, model_dir: Path, prompts: Path, out: Path, s: ServedFidelitySettings) -> list[str]:
    cmd = [str(python), "-m", "swiftkv.vllm_plugin.generate", "--model", str(model_dir), "--prompts", str(prompts),
           "--max-tokens", str(s.new_tokens), "--max-num-seqs", str(s.max_num_seqs), "--kv-cache-gib", "1",
           "--dtype", s.dtype, "--logprobs", str(s.top_k), "-o", str(out)]
    if s.max_num_batched_tokens:
        cmd += ["--max-num-batched-tokens", str(s.max_num_batched_tokens)]
    if s.attention_backend:
        cmd += ["--attention-backend", s.attention_backend]
    if not s.enforce_eager:
        cmd += ["--no-enforce-eager"]
    return cmd


def run_engines(python: str | Path, jobs: dict[str, tuple[Path, dict]], prompts: Path, workdir: Path,
                s: ServedFidelitySettings, repo: Path) -> dict[str, dict]:
    """Run one vLLM engine per job (name -> (checkpoint, extra environment)), one after another; each writes
    ``workdir/<name>.json``. One at a time on purpose: vLLM's CPU build pins every engine's compute thread to the
    same CPU (it keeps one back for its scheduler), so four engines side by side on two CPUs took over 20 min for
    64 prompts where one alone takes ~70 s (start-up included). A failed engine raises with its log's tail."""
    # Snakemake sets the BLAS pools' sizes (MKL_NUM_THREADS ... = the job's threads); in vLLM's worker, pinned to one
    # CPU, a pool of two spins against itself: the engine then ran several times slower. vLLM sizes its own threads.
    base_env = {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_VARIABLES}
    runs = {}
    for name, (ckpt, env) in jobs.items():
        out, log_path = workdir / f"{name}.json", workdir / f"{name}.log"
        with open(log_path, "w") as log:
            proc = subprocess.run(vllm_command(python, ckpt, prompts, out, s), stdout=log, stderr=subprocess.STDOUT,
                                  text=True, cwd=repo, env=dict(base_env, PYTHONPATH=str(repo), **env), check=False)
        if proc.returncode != 0:
            tail = log_path.read_text()[-3000:]
            raise SwiftKVError(f"the vLLM engine of {name} failed (exit {proc.returncode}); its log ends:\n{tail}")
        runs[name] = json.loads(out.read_text())
    return runs


@torch.inference_mode()
def hf_greedy(model, prompts: list[list[int]], new_tokens: int, eos_id) -> list[list[int]]:
    """Greedy continuations, one prompt at a time (no padding), cut after the first EOS as vLLM stops there."""
    out = []
    eos = set(eos_id if isinstance(eos_id, list) else [eos_id]) if eos_id is not None else set()
    for ids in prompts:
        x = torch.tensor([ids])
        gen = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, do_sample=False,
                             eos_token_id=list(eos) or None, pad_token_id=next(iter(eos), 0))[0, len(ids):].tolist()
        cut = []
        for tok in gen:
            cut.append(tok)
            if tok in eos:
                break
        out.append(cut)
    return out


def compare(model, prompts: list[list[int]], reference: list[list[int]], run: dict, k: int,
            scores: list[tuple[list, list]] | None = None) -> list[dict]:
    """One row per prompt: the three measures of one served configuration against the transformers ``model``
    (``scores``: its ``continuation_scores`` on the run's tokens, if already computed)."""
    rows = []
    for i, (prompt, want, got, steps) in enumerate(zip(prompts, reference, run["token_ids"], run["logprobs"],
                                                       strict=True)):
        lps, tops = scores[i] if scores is not None else continuation_scores(model, prompt, got, k)
        diffs = [abs(s["logprob"] - lp) for s, lp in zip(steps, lps, strict=True)]
        overlaps = [len({t for t, _ in s["top"][:k]} & set(top)) / k for s, top in zip(steps, tops, strict=True)]
        rows.append({"prompt": i, "prompt_tokens": len(prompt), "hf_tokens": len(want), "vllm_tokens": len(got),
                     "greedy": common_prefix(want, got) / max(1, len(want)),
                     "logprob_max_abs": max(diffs, default=0.0),
                     "logprob_mean_abs": sum(diffs) / len(diffs) if diffs else 0.0,
                     "topk": sum(overlaps) / len(overlaps) if overlaps else 1.0})
    return rows


def summarize(rows: list[dict], tolerance: Tolerance) -> dict:
    """The measures over every prompt (means; the log-prob maximum over every token) and the verdict."""
    n_tokens = sum(r["vllm_tokens"] for r in rows)
    out = {
        "prompts": len(rows),
        "generated_tokens": n_tokens,
        "greedy_mean": sum(r["greedy"] for r in rows) / len(rows),
        "greedy_identical": sum(r["greedy"] == 1.0 for r in rows) / len(rows),
        "logprob_max_abs": max(r["logprob_max_abs"] for r in rows),
        "logprob_mean_abs": sum(r["logprob_mean_abs"] * r["vllm_tokens"] for r in rows) / max(1, n_tokens),
        "topk_mean": sum(r["topk"] * r["vllm_tokens"] for r in rows) / max(1, n_tokens),
    }
    failed = [name for name, ok in (
        ("greedy_mean", out["greedy_mean"] >= tolerance.greedy_mean),
        ("logprob_max_abs", out["logprob_max_abs"] <= tolerance.logprob_max_abs),
        ("logprob_mean_abs", out["logprob_mean_abs"] <= tolerance.logprob_mean_abs),
        ("topk_mean", out["topk_mean"] >= tolerance.topk_mean)) if not ok]
    out.update(within_tolerance=not failed, outside=failed)
    return out


def served_fidelity(base, tokenizer, conversations, l: int, group_sizes: list[int], python: str | Path,
                    workdir: str | Path, settings: ServedFidelitySettings, tolerance: Tolerance = Tolerance()) -> dict:
    """Convert ``base`` to SwiftKV students (l, each g), serve each with the prefill skip on and off, and compare
    with transformers on held-out prompts. Returns the settings, tolerance and one summary (plus per-prompt rows) per
    configuration ``g<g>-<skip|noskip>``."""
    from swiftkv.measure.fidelity import generation_prompts
    from swiftkv.models.convert import convert_to_swiftkv

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    prompts = generation_prompts(tokenizer, conversations, settings.num_prompts, settings.max_prompt_tokens)
    if len(prompts) < settings.num_prompts:
        raise SwiftKVError(f"only {len(prompts)} held-out prompts of <= {settings.max_prompt_tokens} tokens; "
                           f"lower --num-prompts or raise --max-prompt-tokens")
    (workdir / "prompts.json").write_text(json.dumps(prompts))
    students, jobs = {}, {}
    for g in group_sizes:
        student = convert_to_swiftkv(base, l, g).eval()
        ckpt = workdir / f"ckpt-g{g}"
        student.save_pretrained(ckpt)
        tokenizer.save_pretrained(ckpt)
        students[g] = student
        for skip, env in CONFIGS:
            if skip in settings.prefill_skip:
                jobs[f"g{g}-{skip}"] = (ckpt, env)
    runs = run_engines(python, jobs, workdir / "prompts.json", workdir, settings, REPO)
    eos = tokenizer.eos_token_id
    result = {"settings": asdict(settings), "tolerance": asdict(tolerance), "num_key_value_layers": l,
              "configs": {}}
    for g, student in students.items():
        reference = hf_greedy(student, prompts, settings.new_tokens, eos)
        for skip, _ in CONFIGS:
            name = f"g{g}-{skip}"
            if name not in runs:
                continue
            rows = compare(student, prompts, reference, runs[name], settings.top_k)
            result["configs"][name] = {"key_value_group_size": g, "prefill_skip": skip == "skip",
                                       "kv_sharing_fast_prefill": runs[name]["kv_sharing_fast_prefill"],
                                       **summarize(rows, tolerance), "rows": rows}
    return result
