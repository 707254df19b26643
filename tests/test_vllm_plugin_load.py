"""Loading the SwiftKV vLLM plugin as vLLM does, in a faked ``vllm`` module tree (no vLLM installed): it never raises,
stands aside for an unsupported vLLM or Snowflake's plugin, and the serving driver gives every variant's engine an
explicit ``VLLM_PLUGINS``."""

from __future__ import annotations

import logging
import shlex
import subprocess
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest

import swiftkv.bench.serving.vllm
import swiftkv.configuration
from swiftkv.bench.serving.variants import parse_variants
from swiftkv.bench.serving.vllm import VllmEngine, VllmSettings
from swiftkv.vllm_plugin import (ARCHITECTURES, UNSERVED_ARCHITECTURES, UNSERVED_TARGET, UnservedFamily,
                                 UnservedParallelism, arctic_selected, register)

REPO = Path(__file__).resolve().parents[1]
PLUGIN_LOGGER = "vllm.swiftkv_plugin"


@pytest.fixture
def fake_vllm(monkeypatch):
    """``install(version, config_module=True)``: a ``vllm`` package in sys.modules recording what gets registered."""
    monkeypatch.delenv("ARCTIC_INFERENCE_ENABLED", raising=False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    state = types.SimpleNamespace(models={}, config_hooks={}, auto_configs=0)

    def count_configs():
        state.auto_configs += 1

    monkeypatch.setattr(swiftkv.configuration, "register_configs", count_configs)

    class ModelRegistry:
        @staticmethod
        def register_model(arch, target):
            state.models[arch] = target

    class VerifyAndUpdateConfig:
        @staticmethod
        def verify_and_update_config(vllm_config) -> None:
            raise NotImplementedError

    def install(version: str, config_module: bool = True, device: str = "cpu"):
        vllm = types.ModuleType("vllm")
        vllm.__version__ = version
        vllm.ModelRegistry = ModelRegistry
        platforms = vllm.platforms = types.ModuleType("vllm.platforms")
        platforms.current_platform = types.SimpleNamespace(device_type=device, is_cuda=lambda: device == "cuda")
        modules = {"vllm": vllm, "vllm.platforms": platforms}
        if config_module:
            executor = vllm.model_executor = types.ModuleType("vllm.model_executor")
            models = executor.models = types.ModuleType("vllm.model_executor.models")
            config = models.config = types.ModuleType("vllm.model_executor.models.config")
            config.MODELS_CONFIG_MAP = state.config_hooks
            config.VerifyAndUpdateConfig = VerifyAndUpdateConfig
            modules.update({m.__name__: m for m in (executor, models, config)})
        for name in ("vllm.model_executor", "vllm.model_executor.models", "vllm.model_executor.models.config"):
            monkeypatch.delitem(sys.modules, name, raising=False)
        for name, module in modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        return state

    state.base_hook = VerifyAndUpdateConfig
    return install


def _plugin_lines(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == PLUGIN_LOGGER]


# what a supported vLLM gets: the served architectures, and the unserved SwiftKV ones (which stop with one line)
REGISTERED = {**ARCHITECTURES, **dict.fromkeys(UNSERVED_ARCHITECTURES, UNSERVED_TARGET)}


def _nothing_registered(state) -> bool:
    return state.models == {} and state.config_hooks == {} and state.auto_configs == 0


def test_unsupported_vllm_warns_once_and_registers_nothing(fake_vllm, caplog):
    state = fake_vllm("0.26.0")
    caplog.set_level(logging.INFO, logger=PLUGIN_LOGGER)
    register()  # returns: vLLM's loader would not catch a raise, and every engine in the venv would stop
    assert _nothing_registered(state)
    [(level, line)] = _plugin_lines(caplog)
    assert level == logging.WARNING and "\n" not in line
    assert "0.32.x" in line and "0.26.0" in line and "will not be served" in line and "install vllm 0.32.x" in line


def test_supported_vllm_registers_both_architectures_and_their_config_hooks(fake_vllm, caplog):
    state = fake_vllm("0.32.1+cpu")
    caplog.set_level(logging.INFO, logger=PLUGIN_LOGGER)
    register()
    assert state.models == REGISTERED and state.auto_configs == 1
    assert set(state.config_hooks) == set(REGISTERED)
    hook = state.config_hooks["LlamaSwiftKVForCausalLM"]
    assert issubclass(hook, state.base_hook) and not _plugin_lines(caplog)
    # the hook turns on fast prefill and (on the CPU platform) eager execution for a checkpoint that skips layers >= l
    vllm_config = _vllm_config()
    hook.verify_and_update_config(vllm_config)
    assert vllm_config.model_config.enforce_eager and vllm_config.cache_config.kv_sharing_fast_prefill
    # an unserved family's hook stops the engine's configuration with one line naming the families served
    unserved = state.config_hooks["DeepseekV2SwiftKVForCausalLM"]
    hf_config = types.SimpleNamespace(to_dict=lambda: {"model_type": "deepseek_v2_swiftkv",
                                                       "architectures": ["DeepseekV2SwiftKVForCausalLM"]})
    with pytest.raises(UnservedFamily) as err:
        unserved.verify_and_update_model_config(types.SimpleNamespace(hf_config=hf_config))
    assert "deepseek_v2_swiftkv checkpoints are not served" in str(err.value) and "\n" not in str(err.value)


def _vllm_config(tp: int = 1, kv_heads: int = 2, swiftkv: bool = True):
    hf_config = types.SimpleNamespace(swiftkv=swiftkv, num_key_value_layers=2, num_hidden_layers=4,
                                      num_key_value_heads=kv_heads)
    return types.SimpleNamespace(model_config=types.SimpleNamespace(hf_config=hf_config, enforce_eager=False),
                                 cache_config=types.SimpleNamespace(kv_sharing_fast_prefill=False),
                                 parallel_config=types.SimpleNamespace(tensor_parallel_size=tp))


def test_cuda_keeps_the_engines_graph_setting(fake_vllm, caplog):
    """Issue 32 (d): enforce_eager is set on the CPU platform (previous test) but not on CUDA, where the engine's own
    choice stands; fast prefill is turned on either way."""
    state = fake_vllm("0.32.0", device="cuda")
    register()
    vllm_config = _vllm_config()
    state.config_hooks["LlamaSwiftKVForCausalLM"].verify_and_update_config(vllm_config)
    assert vllm_config.model_config.enforce_eager is False and vllm_config.cache_config.kv_sharing_fast_prefill


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_tensor_parallel_beyond_the_kv_heads_is_refused_in_one_line(fake_vllm, device):
    """Issue 32 (b): the plugin does not replicate KV heads across ranks, so the config hook (in the process that
    configures the engine, before any worker starts) refuses a TP size that does not divide them; sizes that do,
    and a checkpoint served as its teacher (vLLM's own layers replicate), pass."""
    state = fake_vllm("0.32.0", device=device)
    register()
    hook = state.config_hooks["Qwen2SwiftKVForCausalLM"]
    for tp, kv_heads in [(1, 2), (2, 2), (2, 4), (4, 8), (1, 3)]:
        hook.verify_and_update_config(_vllm_config(tp, kv_heads))
    hook.verify_and_update_config(_vllm_config(4, 2, swiftkv=False))
    for tp, kv_heads in [(4, 2), (2, 3), (8, 4)]:
        config = _vllm_config(tp, kv_heads)
        with pytest.raises(UnservedParallelism) as err:
            hook.verify_and_update_config(config)
        line = str(err.value)
        assert "\n" not in line and f"--tensor-parallel-size {tp} does not divide {kv_heads}" in line, line
        assert config.cache_config.kv_sharing_fast_prefill is False  # stopped before changing anything


def test_release_lacking_the_config_hooks_warns_once(fake_vllm, caplog):
    state = fake_vllm("0.32.0.dev1", config_module=False)
    caplog.set_level(logging.INFO, logger=PLUGIN_LOGGER)
    register()
    assert _nothing_registered(state)
    [(level, line)] = _plugin_lines(caplog)
    assert level == logging.WARNING and "vllm.model_executor" in line and "will not be served" in line
    assert "\n" not in line


@pytest.mark.parametrize("env,stands_aside", [
    ({"ARCTIC_INFERENCE_ENABLED": "1"}, True),
    ({"ARCTIC_INFERENCE_ENABLED": "1", "VLLM_PLUGINS": "arctic_inference,swiftkv"}, True),
    ({"ARCTIC_INFERENCE_ENABLED": "0"}, False),
    ({"ARCTIC_INFERENCE_ENABLED": "true"}, False),  # arctic-inference itself loads on "1" only
    ({"ARCTIC_INFERENCE_ENABLED": "1", "VLLM_PLUGINS": "swiftkv"}, False),  # vLLM will not load Snowflake's plugin
])
def test_stands_aside_when_snowflakes_plugin_is_selected(fake_vllm, caplog, monkeypatch, env, stands_aside):
    state = fake_vllm("0.32.0")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    caplog.set_level(logging.INFO, logger=PLUGIN_LOGGER)
    register()
    assert arctic_selected() is stands_aside
    if stands_aside:
        assert _nothing_registered(state)
        [(level, line)] = _plugin_lines(caplog)
        assert level == logging.INFO and "ARCTIC_INFERENCE_ENABLED=1" in line and "\n" not in line
    else:
        assert state.models == REGISTERED and set(state.config_hooks) == set(REGISTERED)
        assert not _plugin_lines(caplog)


# -- the serving driver: one plugin per engine, chosen per variant -------------------------------------------------


def _rule_variants(profile: str, target: str, tmp_path) -> tuple[str, list[str]]:
    """MODEL and the --variant arguments of the `swiftkv bench serve` command a profile's rule runs for ``target``."""
    out = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--cores", "1", f"--configfile={profile}",
                          "--directory", str(tmp_path), "--snakefile", str(REPO / "Snakefile"), "--", target],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    [line] = [t for t in (out.stdout + out.stderr).splitlines() if "swiftkv bench serve " in t]
    args = shlex.split(line[line.index("swiftkv bench serve "):])[3:]
    return args[0], [args[i + 1] for i, a in enumerate(args) if a == "--variant"]


@pytest.mark.parametrize("profile,engine,model,expected", [
    ("config/paper.yaml", "vllm-gpu", "llama-3.1-8b-instruct",
     {"base": "", "swiftkv-50": "arctic_inference", "swiftkv-50-acrosskv-4": "arctic_inference"}),
    ("config/config.yaml", "vllm-cpu", "smollm2-135m",
     {"base": "", "swiftkv-50": "swiftkv", "swiftkv-50-acrosskv-3": "swiftkv"}),
])
def test_every_variant_engine_gets_explicit_plugins(profile, engine, model, expected, tmp_path, monkeypatch):
    monkeypatch.setattr(swiftkv.bench.serving.vllm, "_model_config", lambda model: None)  # no hub, no checkpoints here
    monkeypatch.setenv("VLLM_PLUGINS", "swiftkv,arctic_inference")  # what this shell exports does not leak in
    monkeypatch.setenv("ARCTIC_INFERENCE_ENABLED", "1")
    source, variants = _rule_variants(profile, f"results/bench/serve/{engine}/{model}/throughput.json", tmp_path)
    specs = parse_variants(variants)
    device = "cuda" if engine == "vllm-gpu" else "cpu"
    engine = VllmEngine(source, specs, VllmSettings(device=device, workdir=str(tmp_path)), progress=False)
    envs = {spec.id: engine.env(spec) for spec in specs}
    assert {name: env["VLLM_PLUGINS"] for name, env in envs.items()} == expected
    for name, env in envs.items():  # the plugin that serves a row is the only SwiftKV plugin its engine loads
        assert arctic_selected(env) is (expected[name] == "arctic_inference")
    # a SwiftKV row served by our plugin on the GPU (the paper's rows without ARCTIC_INFERENCE_ENABLED)
    ours = replace(specs[1], id="ours", env={})
    assert engine.env(ours)["VLLM_PLUGINS"] == "swiftkv" and not arctic_selected(engine.env(ours))
    # a variant's own VLLM_PLUGINS wins
    assert engine.env(replace(ours, env={"VLLM_PLUGINS": "other"}))["VLLM_PLUGINS"] == "other"


def test_checkpoint_without_l_is_served_by_our_plugin(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "llama_swiftkv", "architectures": ["LlamaSwiftKVForCausalLM"], '
                                      '"num_hidden_layers": 4, "num_key_value_layers": 2}')
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    specs = parse_variants(["base", f'{{"id": "skv", "model": "{ckpt}"}}'])
    engine = VllmEngine(str(tmp_path), specs, VllmSettings(workdir=str(tmp_path)), progress=False)
    assert [engine.env(s)["VLLM_PLUGINS"] for s in specs] == ["", "swiftkv"]
