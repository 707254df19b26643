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
