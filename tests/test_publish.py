"""Publishing a run as the evidence of record (analysis.publish): only from a clean checkout, only a clean run of the
default profile, never over local changes, and not at all when the evidence is the same apart from wall times."""

import json
import subprocess
from pathlib import Path

import pytest

from analysis.publish import main, publish
from analysis.raw import MANIFEST, RawError, collect, verify

ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
       "PATH": "/usr/bin:/bin"}


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env=ENV).stdout.strip()


def result(acc: float, seconds: float) -> str:
    return json.dumps({"results": {"task": {"acc,none": acc}}, "date": seconds,
                       "swiftkv": {"seconds_lm_eval": seconds}})


@pytest.fixture()
def repo(tmp_path, monkeypatch):
    """A checkout with a committed raw folder reports/raw/table2 (accuracy 0.5) and code, all committed."""
    monkeypatch.chdir(tmp_path)
    git(tmp_path, "init", "-q")
    Path(".gitignore").write_text("/results\n")
    Path("code.py").write_text("x = 1\n")
    src = Path("results/eval/m/v/native/lm_eval.json")
    src.parent.mkdir(parents=True)
    src.write_text(result(0.5, 10.0))
    collect([str(src)], "reports/raw/table2", "h0", "c0", profile="default")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "committed evidence")
    return tmp_path


def run(acc: float, seconds: float, **manifest) -> Path:
    """The run's own raw folder results/reports/raw/table2 (the default profile unless told)."""
    src = Path("results/eval/m/v/native/lm_eval.json")
    src.write_text(result(acc, seconds))
    dest = Path("results/reports/raw/table2")
    collect([str(src)], dest, "h1", manifest.pop("commit", "c1"), **{"profile": "default", **manifest})
    Path("results/reports/provenance.json").write_text(json.dumps({"date (UTC)": "then", "git commit": "c1",
                                                                    "artifacts (last written, UTC)": {"x": "then"}}))
    return dest


def test_a_clean_default_run_is_published_and_the_same_evidence_is_kept(repo):
    run(0.5, 99.0)  # the same result, another wall time and date
    before = Path("reports/raw/table2/manifest.json").read_bytes()
    assert publish(["table2"]) == ["table2: kept (the run's evidence equals the committed one, apart from wall times "
                                   "and dates)"]
    assert Path("reports/raw/table2/manifest.json").read_bytes() == before
    src = run(0.6, 99.0)
    assert publish(["table2"])[0].startswith("table2: published (1 files")
    dst = Path("reports/raw/table2")
    assert verify(dst) == [] and (dst / MANIFEST).read_bytes() == (src / MANIFEST).read_bytes()
    assert json.loads((dst / "eval/m/v/native/lm_eval.json").read_text())["results"]["task"]["acc,none"] == 0.6
    assert not [p for p in dst.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left behind
    provenance = json.loads(Path("reports/provenance.json").read_text())  # the run's record, and what was published
    assert provenance["date (UTC)"] == "then" and "artifacts (last written, UTC)" not in provenance
    assert provenance["published (commit: raw folders)"] == {git(repo, "rev-parse", "HEAD"): "table2"}
    assert provenance["raw results (raw/<study>: collected at commit, config hash, files)"]["table2"]["collected at"] \
        == "c1"


@pytest.mark.parametrize("case, why", [
    ("dirty checkout", "tracked files outside reports/ differ from HEAD"),
    ("dirty run", "was collected from a tree with uncommitted changes"),
    ("ci profile", "was collected on the ci profile"),
    ("overrides", "was collected with --config overrides (distill)"),
    ("edited evidence", "reports/raw/table2 has uncommitted changes"),
    ("no run", "has no manifest.json: run the study first"),
    ("damaged run", "is damaged"),
    ("archive", "a study is a folder under results/reports/raw/"),
])
def test_publishing_is_refused_and_nothing_is_copied(repo, case, why):
    study = "table2"
    if case == "dirty checkout":
        run(0.6, 1.0)
        Path("code.py").write_text("x = 2\n")
    elif case == "dirty run":
        run(0.6, 1.0, commit="c1+dirty")
    elif case == "ci profile":
        run(0.6, 1.0, profile="ci")
    elif case == "overrides":
        run(0.6, 1.0, overrides={"distill": {"tokens": 8}})
    elif case == "edited evidence":
        run(0.6, 1.0)
        Path("reports/raw/table2/eval/m/v/native/lm_eval.json").write_text(result(0.7, 1.0))
    elif case == "damaged run":
        run(0.6, 1.0)
        Path("results/reports/raw/table2/eval/m/v/native/lm_eval.json").write_text(result(0.8, 1.0))
    elif case == "archive":
        study = "archive/superseded/old"
    committed = {p: p.read_bytes() for p in Path("reports").rglob("*") if p.is_file()}
    with pytest.raises(RawError, match=why.replace("(", r"\(").replace(")", r"\)")):
        publish([study])
    assert {p: p.read_bytes() for p in Path("reports").rglob("*") if p.is_file()} == committed


def test_the_command_line_refuses_in_one_line_and_publishes_without_rendering(repo, capsys):
    run(0.6, 1.0, profile="ci")
    with pytest.raises(SystemExit) as exit_:
        main(["table2", "--no-render"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2 and "the run has: table2" in capsys.readouterr().err
    run(0.6, 1.0)
    assert main(["--all", "--no-render"]) == 0 and "table2: published" in capsys.readouterr().out
