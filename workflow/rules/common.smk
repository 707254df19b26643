# Shared helpers for the rules: model sources and wildcard constraints.
import hashlib
import json
import os
from pathlib import Path

import pandas as pd
from snakemake.exceptions import WorkflowError

from analysis.raw import eval_path  # where an evaluation lives under results/eval (writer and reader alike)
from analysis.raw import serving_raw  # a serving study's raw folder (rule raw_serving, the figures, the claims)
from swiftkv.data.bigbench import tasks_dir as bigbench_tasks_dir  # extracted BIG-bench tasks, keyed by task list

MODELS = {m["id"]: m for m in config["models"]}

# Embedded models live in this workflow's resources/, where prepare_model writes them; every job reads them from
# there, whatever SWIFTKV_RESOURCES the shell exports (the swiftkv CLI's default for --resources).
RESOURCES = "resources"
os.environ.update(SWIFTKV_RESOURCES=RESOURCES)  # (set for the jobs, not read: no `envvars:` to assert)


def output_dir(wildcards, output):
    """params function: the folder of a rule's first output (for commands that take a folder and name the files)."""
    return str(Path(output[0]).parent)


def resources_root(wildcards, output):
    """params function: the resources folder a model directory output (resources/models/<id>) lies in."""
    return str(Path(output[0]).parent.parent)


def _all_cores():
    """Every core snakemake was given; 1 when it was given none (--unlock, --list-rules, ...), where no job runs."""
    try:
        return workflow.cores
    except WorkflowError:
        return 1


ALL_CORES = _all_cores()  # the threads of a job that runs alone (timings) or uses every core


def _distill_threads():
    """Threads of one distillation job (config distill.threads_per_job; null = every core, one job at a time)."""
    per_job = config["distill"].get("threads_per_job")
    return min(per_job, ALL_CORES) if per_job else ALL_CORES


DISTILL_THREADS = _distill_threads()


def job_resources(kind):
    """What a job of this kind that runs a model asks the scheduler for (its `resources`): gpu (a count), mem_mb and
    runtime (minutes), from the profile's resources section (config/config.yaml: 0 GPUs; config/paper.yaml: the
    paper's). A Snakemake profile under workflow/profiles/ that declares resources gpu=N caps each job's gpu at N."""
    spec = config["resources"][kind]
    return {"gpu": spec["gpu"], "mem_mb": spec["mem_mb"], "runtime": spec["runtime"]}


wildcard_constraints:  # the ids of config models and of variants-sheet rows (one definition for every rule)
    model="[a-z0-9][a-z0-9.-]*",
    variant="[a-z0-9][a-z0-9.-]*",


def model_spec(model):
    try:
        return MODELS[model]
    except KeyError:
        raise ValueError(f"model {model!r} is not in config 'models' ({', '.join(MODELS)}); add it to the profile")


def model_source(wildcards):
    """What the CLI gets as MODEL: an embedded id (prepared under resources/) or a hub id."""
    spec = model_spec(wildcards.model)
    return spec["hub_id"] if spec["source"] == "hub" else wildcards.model


def model_input(wildcards):
    """Embedded models need resources/models/<id> prepared first; hub models need nothing local."""
    spec = model_spec(wildcards.model)
    return [f"resources/models/{wildcards.model}"] if spec["source"] == "embedded" else []


DTYPE = config["dtype"]  # every model run's precision (science, from the profile)
MIXED_PRECISION = {"auto": "", "float32": "--mixed-precision no", "bfloat16": "--mixed-precision bf16"}[DTYPE]


def config_hash():
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


# --- distillation (issue 4): the variants sheet, validated --------------------------------------------------------


def repo_file(path):
    """A relative path from the profile: in the working directory if there, else in the repository."""
    path = Path(path)
    return path if path.is_absolute() or path.exists() else Path(workflow.basedir) / path


def load_variants(path):
    """config/variants.tsv as a DataFrame, schema-validated, with the checks a row schema cannot make."""
    path = repo_file(path)
    if not path.is_file():
        stop(f"variants sheet {path} not found (config distill.variants)")
    try:
        sheet = pd.read_csv(
            path, sep="\t", dtype={"kv_heads": "Int64"}, keep_default_na=False, na_values={"kv_heads": [""]}
        )
        validate(sheet, "../schemas/variants.schema.yaml")
    except Exception as err:  # pandas' or the schema's error, reduced to its one informative line
        lines = [x for x in str(err).splitlines() if x.strip()]
        why = next((x for x in lines if x.startswith("ValidationError:")), lines[-1] if lines else repr(err))
        stop(f"{path}: {why.removeprefix('ValidationError: ')}")
    dupes = sheet[sheet.duplicated(["model", "variant"])]
    if len(dupes):
        stop(f"{path}: (model, variant) appears twice: {dupes[['model', 'variant']].values.tolist()}")
    for row in sheet.itertuples():
        L = model_layers(row.model)
        if L is None:
            continue  # a model this profile does not know: checked when one of its rows is requested
        l, g = row.num_key_value_layers, row.key_value_group_size
        if not 1 <= l <= L or (L - l) % g:
            stop(f"{path}: {row.model}/{row.variant}: l={l}, g={g} invalid for L={L} layers "
                 "(need 1 <= l <= L and g dividing L - l)")
        heads, kv = model_dim(row.model, "num_attention_heads"), model_dim(row.model, "num_key_value_heads")
        n_kv = None if pd.isna(row.kv_heads) else int(row.kv_heads)
        if n_kv and heads and kv and (heads % n_kv or kv % n_kv):
            fits = [d for d in range(1, kv + 1) if kv % d == 0 and heads % d == 0]
            stop(f"{path}: {row.model}/{row.variant}: kv_heads={n_kv} must divide the model's {heads} attention "
                 f"heads and {kv} KV heads; use one of {fits}")
    return sheet.set_index(["model", "variant"], drop=False)


def model_dim(model, key):
    """A size of a model (num_hidden_layers, num_attention_heads, num_key_value_heads): the profile's distill.<key>,
    else config/models/<model>.json (paper models), else None (checked when one of its rows is requested)."""
    known = config.get("distill", {}).get(key, {})
    if model in known:
        return known[model]
    path = Path(workflow.basedir) / "config" / "models" / f"{model}.json"
    if path.is_file():
        return json.loads(path.read_text()).get(key)
    return None


def model_layers(model):
    """L of a model (``model_dim``)."""
    return model_dim(model, "num_hidden_layers")


def profile_rows(sheet):
    """The sheet's rows this profile runs: those named in distill.rows (and every model's base row), else all."""
    rows = config["distill"].get("rows")
    if rows is None:
        return sheet
    unknown = sorted(set(rows) - set(sheet.variant))
    if unknown:
        known = sorted(set(sheet[sheet.model.isin(config["distill"]["models"])].variant))
        stop(f"distill.rows names {unknown}, not rows of {config['distill']['variants']} for distill.models; "
             f"they are {known}")
    return sheet[sheet.variant.isin(set(rows) | {"base"})]


VARIANTS = profile_rows(load_variants(config["distill"]["variants"])) if "distill" in config else None


def distill_targets(wildcards=None):
    """Checkpoint dirs of every trainable (model, variant) row of the profile's distill models (all but base)."""
    rows = VARIANTS[VARIANTS.model.isin(config["distill"]["models"]) & (VARIANTS.variant != "base")]
    return [f"results/checkpoints/{m}/{v}" for m, v in zip(rows.model, rows.variant)]


def distill_budget_args(wildcards):
    """CLI options for the training budget and recipe of this profile (config: distill)."""
    d = config["distill"]
    opts = {
        "tokens": d["tokens"],
        "max-length": d["max_length"],
        "heldout-tokens": d["heldout_tokens"],
        "seed": d["seed"],
        "data": d["data"],
        "batch-size": d["batch_size"],  # the global batch: the same students at any process count
    }
    opts.update(d.get("overrides", {}))
    seed = getattr(wildcards, "seed", None)
    if seed is not None:  # a seeds-study run (rule distill_swiftkv_seed)
        opts["seed"] = int(seed)
    scope = VARIANTS.loc[(wildcards.model, wildcards.variant)].scope if hasattr(wildcards, "variant") else None
    if scope in d.get("lr_by_scope", {}):  # the lr the sweep chose for this training scope (reports/lr_sweep.csv)
        opts["lr"] = d["lr_by_scope"][scope]
    lr = getattr(wildcards, "lr", None)
    if lr is not None:  # a learning-rate sweep run (rule distill_lr_sweep)
        opts["lr"] = lr
    return " ".join(f"--{k} {v}" for k, v in opts.items())


def teacher_cache_spec(wildcards):
    """What the model's teacher cache of a seed must hold: every l its trainable rows use, and the largest budget
    trained from it (the table budget, or the distillation curve's for its model and the profile's seed)."""
    d, model = config["distill"], wildcards.model
    rows = VARIANTS[(VARIANTS.model == model) & (VARIANTS.variant != "base")]
    tokens = d["tokens"]
    if d["curve"]["model"] == model and int(wildcards.seed) == d["seed"]:  # the curve trains with the profile's seed
        tokens = max(tokens, d["curve"]["tokens"])
    return {"layers": " ".join(str(l) for l in sorted(set(rows.num_key_value_layers))), "tokens": tokens}


def teacher_cache_input(wildcards):
    """The distillation's teacher cache (profiles with distill.teacher_cache), else nothing."""
    if not config["distill"]["teacher_cache"]:
        return []
    seed = getattr(wildcards, "seed", config["distill"]["seed"])
    return [f"results/teacher_cache/{wildcards.model}/seed-{seed}"]


def teacher_cache_arg(wildcards, input):
    return f"--teacher-cache {input.cache}" if input.cache else ""


def distill_curve_args(wildcards):
    c = config["distill"]["curve"]
    return f"{distill_budget_args(wildcards)} --tokens {c['tokens']} --eval-every {c['eval_every']}"


def distill_ranks(resources):
    """Processes a distillation job runs: one per GPU the job was given (its resources gpu: config
    resources.distill.gpu, capped by a profile's resources: gpu=N) under the profile's accelerate config; 0 for a
    plain one-process `swiftkv distill` (no accelerate config, or no GPU)."""
    return resources.gpu if config["distill"].get("accelerate_config") and resources.gpu else 0


def distill_launcher(wildcards, resources):
    """`swiftkv` (one process), or `accelerate launch` with the profile's accelerate config and distill_ranks
    processes (overriding the accelerate config's num_processes)."""
    ranks = distill_ranks(resources)
    if not ranks:
        return "swiftkv"
    cfg = config["distill"]["accelerate_config"]
    return f"accelerate launch --config_file {cfg} --num_processes {ranks} -m swiftkv.cli"


def distill_runtime_args(wildcards, resources):
    """How a distillation computes, not what it learns: the profile's mixed precision, micro-batches (config
    distill.micro_batch_size: rows per forward on each process, gradients accumulated) and gradient checkpointing
    (distill.gradient_checkpointing); under a launcher with more than one process, --processes (swiftkv distill
    refuses a launch that started another number) and, where the profile names one (config distill.strategy), the
    strategy (else swiftkv distill's default: ddp)."""
    d = config["distill"]
    strategy, micro = d.get("strategy"), d.get("micro_batch_size")
    ranks = distill_ranks(resources)
    return " ".join(x for x in (MIXED_PRECISION, f"--micro-batch-size {micro}" if micro else "",
                                "--gradient-checkpointing" if d.get("gradient_checkpointing") else "",
                                f"--processes {ranks}" if ranks > 1 else "",
                                f"--strategy {strategy}" if strategy else "") if x)


def student_args(model, variant):
    """The student a distillation trains, as `swiftkv distill` options from its validated sheet row (the library
    never reads the sheet): its name, l, g, MQA heads, loss, scope, and --no-train for an untrained row. Fails at
    DAG build for a (model, variant) that is not a trainable row."""
    if (model, variant) not in VARIANTS.index:
        raise ValueError(f"{model}/{variant} is not in {config['distill']['variants']}")
    if variant == "base":
        raise ValueError("the base model is not distilled: evaluation reads it directly")
    row = VARIANTS.loc[(model, variant)]
    opts = [f"--name {variant}", f"-l {int(row.num_key_value_layers)}", f"-g {int(row.key_value_group_size)}"]
    if not pd.isna(row.kv_heads):
        opts.append(f"--kv-heads {int(row.kv_heads)}")
    opts += [f"--{k} {row[k]}" for k in ("loss", "scope") if row[k] != "none"]
    if row.train == "no":
        opts.append("--no-train")
    return " ".join(opts)


def bench_distill_args(wildcards):
    """l of the benchmarked variant (from the sheet) and the benchmark sizes (config: distill.bench)."""
    b = config["distill"]["bench"]
    row = VARIANTS.loc[(wildcards.model, b["variant"])]
    return (
        f"-l {row.num_key_value_layers} --max-length {b['max_length']} --batches {b['batches']} "
        f"--warmup {b['warmup']} --repeats {b['repeats']} --data {config['distill']['data']} --dtype {DTYPE}"
    )
