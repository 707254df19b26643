"""The report page: Markdown tables, a self-contained page led by the registered claims, provenance."""

import re
from pathlib import Path

import pandas as pd
import pytest

from analysis.report import Section, markdown_html, render_html


def test_markdown_tables_and_a_self_contained_page(tmp_path):
    md = "**Table X**\n\n| row | acc |\n|---|---:|\n| base | 50.0 [40.0, 60.0] |\n\n- note `a`\n"
    out = markdown_html(md)
    assert "<th>row</th>" in out and "<td>50.0 [40.0, 60.0]</td>" in out and "<b>Table X</b>" in out
    assert "<li>note <code>a</code></li>" in out
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1])
    fig.savefig(tmp_path / "f.png")
    pd.DataFrame({"a": [1.0], "b": ["x"]}).to_csv(tmp_path / "t.csv", index=False)
    from pathlib import Path

    from analysis.claims import evaluate
    from analysis.report import ABSENT

    registry = evaluate(Path(__file__).resolve().parents[1] / "reports", commit="abc")
    page = render_html("T", [Section("Fig", str(tmp_path / "f.png"), "cap ``x``"), Section("Tab", str(tmp_path / "t.csv")),
                             Section("Gone", str(tmp_path / "none.csv"))], {"git commit": "abc"}, registry)
    assert "data:image/png;base64," in page and "<code>x</code>" in page and ABSENT in page
    assert not re.search(r"(src|href)=['\"]https?:", page)  # nothing fetched from elsewhere


def test_the_page_leads_with_the_registered_claims():
    from pathlib import Path

    from analysis import disagreements
    from analysis.claims import evaluate, load_registry

    reports = Path(__file__).resolve().parents[1] / "reports"
    registry = evaluate(reports, commit="abc")
    items = disagreements.rows(registry, load_registry(), reports)
    page = render_html("T", [], {"git commit": "abc"}, registry, disagreements=disagreements.html_table(items),
                       registration=disagreements.registration_summary(registry))
    # the disagreements open the page, failing claims first, then every claim by its registered rule (one table)
    assert page.index("Where the reproduction disagrees with the paper") < page.index("by its registered rule")
    assert "Earlier judgements" not in page and page.count("<table class='claims'>") == 3  # + provenance
    assert [d["verdict"] for d in items] == sorted((d["verdict"] for d in items), key=lambda v: v != "does not hold")
    assert {d["id"] for d in items} == set(registry[registry.verdict != "holds"].id)
    assert f"{len(registry)} registered claims:" in page and "How the rules were written" in page
    assert "83396b1" in page and "with data of theirs already measured" in page
    for cid in registry.id:
        assert f"<code>{cid}</code>" in page
    awaiting = int((registry.status == "awaiting").sum())
    assert page.count("not measured yet") == awaiting


def planned_jobs(profile: str, *targets: str) -> list[dict]:
    """Every job of a dry run with --forceall: rule, inputs and outputs."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "snakemake", *targets, "-n", "--forceall", "--nolock", "--cores", "1",
                          f"--configfile={profile}"], cwd=repo, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    jobs = []
    for m in re.finditer(r"^(?:local)?rule (\S+):\n((?: {4}.*\n)+)", out.stdout, re.M):
        fields = dict(line.strip().split(": ", 1) for line in m.group(2).splitlines() if ": " in line)
        jobs.append({"rule": m.group(1), **{k: fields.get(k, "").split(", ") if fields.get(k) else []
                                            for k in ("input", "output")}})
    assert jobs, out.stdout[-2000:]
    return jobs


USER_TARGETS = {"config/config.yaml": ("all", "results/reports/report.html"),
                "config/ci.yaml": ("results/reports/report.html",),
                "config/paper.yaml": ("results/reports/report.html",)}


@pytest.mark.parametrize("profile", list(USER_TARGETS))
def test_a_run_writes_nothing_under_the_committed_reports(profile):
    """The user-facing targets of every profile render the run's own page under results/reports/, from the run's
    own raw folders: no job writes anything under reports/, and the only file a job reads there is the registered
    suite's committed selection run, where the profile says so (eval.bigbench.selection_from: the default profile
    re-derives the suite from it instead of rerunning the base model on the selection halves; every number the run
    reports is its own)."""
    jobs = planned_jobs(profile, *USER_TARGETS[profile])
    assert "render_report" in {j["rule"] for j in jobs}
    assert [o for j in jobs for o in j["output"] if o.startswith("reports/")] == []
    read = sorted({(j["rule"], i) for j in jobs for i in j["input"] if i.startswith("reports/")})
    if profile == "config/config.yaml":
        assert read == [("committed_selection_run", "reports/raw/suite/eval/smollm2-135m/selection/lm_eval.json.gz")]
    else:
        assert read == []
    raw = {o for j in jobs if j["rule"].startswith("raw_") for o in j["output"]}
    assert raw and all(o.startswith("results/reports/raw/") for o in raw)
    if profile == "config/config.yaml":  # every study of the layout (analysis.raw.STUDIES) has its raw_* rule
        from analysis.raw import RUN, STUDIES

        assert raw == {f"{RUN}/raw/{s}" for s in STUDIES}


def test_the_committed_reports_render_from_the_committed_raw_folders_only():
    """reports/* re-render (publish: --forceall) from reports/raw/* and reports/provenance.json, which no rule
    writes: only table, figure, claims and page jobs, reading committed files."""
    from analysis.raw import verify

    jobs = planned_jobs("config/config.yaml", "reports/report.html")
    rules = {j["rule"] for j in jobs}
    assert rules >= {"make_table", "make_claims", "render_report"}
    assert all(r.startswith(("make_", "plot_")) or r in ("render_report", "render_readme") for r in rules), rules
    outputs = [o for j in jobs for o in j["output"]]
    assert all(o.startswith("reports/") and not o.startswith("reports/raw/") for o in outputs), outputs
    inputs = {i for j in jobs for i in j["input"]} - set(outputs)
    repo = Path(__file__).resolve().parents[1]
    assert all(i.startswith(("reports/raw/", "analysis/", str(repo / "workflow" / "report")))
               or i == "reports/provenance.json" for i in inputs), inputs
    assert all(verify(repo / i) == [] for i in inputs if i.startswith("reports/raw/"))


def test_report_checks_find_what_is_wrong(tmp_path):
    import matplotlib.pyplot as plt

    from analysis.checks import EXPECTED_COLUMNS, FIGURES, check_reports

    problems = check_reports(tmp_path)
    assert any("figure3_throughput.png: missing" in p for p in problems)
    for name in FIGURES:
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        fig.savefig(tmp_path / name)
        plt.close(fig)
    for name, cols in EXPECTED_COLUMNS.items():
        pd.DataFrame([dict.fromkeys(cols, 1)]).to_csv(tmp_path / name, index=False)
        (tmp_path / name).with_suffix(".md").write_text("| a |\n")
    (tmp_path / "report.html").write_text("<img src='data:image/png;base64,AAAA'>")
    assert check_reports(tmp_path) == []
    pd.DataFrame({"model": ["m"]}).to_csv(tmp_path / "table2.csv", index=False)
    (tmp_path / "figure2_simscore.png").write_bytes(b"not a png")
    problems = check_reports(tmp_path)
    assert len(problems) == 2 and "missing columns" in " ".join(problems) and "does not open" in " ".join(problems)


def test_report_checks_cli_rejects_a_missing_directory(tmp_path, capsys):
    from analysis.checks import main

    assert main([str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a directory" in err
    assert main([str(tmp_path)]) == 1 and "figure3_throughput.png: missing" in capsys.readouterr().err


def test_page_tables_drop_repeated_and_empty_columns_and_fill_captions(tmp_path):
    from analysis.report import csv_html, display_frame, fill_caption

    df = pd.DataFrame({"source": ["vLLM · cpu · m"], "engine": ["vllm"], "hardware": ["cpu"], "model": ["m"],
                       "variant": ["swiftkv-50"], "label": ["SwiftKV 50%"], "empty": [None], "speedup": [1.5]})
    assert list(display_frame(df).columns) == ["source", "label", "speedup"]
    assert list(display_frame(df.drop(columns=["source", "label"])).columns) == ["engine", "hardware", "model",
                                                                                "variant", "speedup"]
    path = tmp_path / "table3.csv"
    df.to_csv(path, index=False)
    page = csv_html(path)
    assert "<th>engine</th>" not in page and "not shown (in the CSV): engine, hardware, model, variant, empty" in page
    text = "{{ snakemake.wildcards.table }}: scores in percent"
    assert fill_caption(text, "reports/table4a.csv") == "table4a: scores in percent"


def test_artifact_dates_list_each_output_but_the_provenance_file(tmp_path):
    import os

    from swiftkv.bench.provenance import artifact_dates

    (tmp_path / "table2.csv").write_text("a\n1\n")
    (tmp_path / "figure.png").write_bytes(b"x")
    (tmp_path / "provenance.json").write_text("{}")
    os.utime(tmp_path / "table2.csv", (0, 0))
    dates = artifact_dates(tmp_path)
    assert list(dates) == ["figure.png", "table2.csv"]
    assert dates["table2.csv"] == "1970-01-01 00:00"


def test_job_times_sum_benchmark_files_per_rule_and_skip_foreign_tsvs(tmp_path):
    from analysis.report import provenance_html
    from swiftkv.bench.provenance import job_times, provenance

    header = "s\th:m:s\tmax_rss\n"
    for rel, sec in [("distill_swiftkv/m/a.tsv", "600.0"), ("distill_swiftkv/m/b.tsv", "300.0"),
                     ("eval_swiftkv/m/base/native.tsv", "1800.0")]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(header + f"{sec}\t0:00:00\t1\n")
    (tmp_path / "eval_swiftkv" / "notes.tsv").write_text("x\ty\n1\t2\n")  # not a benchmark file
    (tmp_path / "eval_swiftkv" / "empty.tsv").write_text(header)  # interrupted: no measurement line
    times = job_times(tmp_path)
    assert times == {"jobs timed": 3, "total (h)": 0.75, "distill_swiftkv (min)": 15.0, "eval_swiftkv (min)": 30.0}
    assert job_times(tmp_path / "absent") == {"jobs timed": 0, "total (h)": 0.0}
    info = provenance("config/config.yaml", "abc123", extra={"x": 1}, benchmarks=tmp_path)
    assert list(info)[-2:] == ["x", "job wall time (benchmarks/, summed per rule)"]
    assert info["job wall time (benchmarks/, summed per rule)"] == times
    page = provenance_html({"job wall time": times, "git commit": "abc"})
    assert "distill_swiftkv (min): 15.0<br>eval_swiftkv (min): 30.0" in page and "<td>abc</td>" in page


def test_git_commit_is_dirty_for_code_changes_not_for_rewritten_reports(tmp_path):
    import subprocess

    from swiftkv.provenance import git_commit

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)

    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "table2.csv").write_text("a\n1\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "c")
    head = git_commit(tmp_path)
    assert len(head) == 40
    (tmp_path / "reports" / "table2.csv").write_text("a\n2\n")
    assert git_commit(tmp_path) == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == head + "+dirty"
    assert git_commit(tmp_path / "not-a-repo") == "unknown"


def test_accuracy_tables_on_the_page_show_the_comparison_before_the_tasks():
    md = ("| row | task_a | task_b | average | Δ vs base | KL | paper avg | paper Δ |\n"
          "|---|---|---|---|---|---|---|---|\n"
          "| r1 | 1 | 2 | 1.5 | -0.5 | 0.1 | 72.7 | -1.0 |\n")
    heads = re.findall(r"<th>(.*?)</th>", markdown_html(md))
    assert heads == ["row", "average", "paper avg", "Δ vs base", "paper Δ", "KL", "task_a", "task_b"]
    assert re.findall(r"<td>(.*?)</td>", markdown_html(md)) == ["r1", "1.5", "72.7", "-0.5", "-1.0", "0.1", "1", "2"]


def test_wide_serving_tables_show_the_result_before_the_workload(tmp_path):
    from analysis.report import csv_html

    cols = {"source": ["vLLM · cpu · m"], **{f"w{i}": [i] for i in range(9)}, "label": ["Base"], "speedup": [1.5],
            "kv_cache_bytes": [23_550_000.0]}
    pd.DataFrame(cols).to_csv(tmp_path / "t.csv", index=False)
    out = csv_html(tmp_path / "t.csv")
    assert re.findall(r"<th>(.*?)</th>", out)[:3] == ["source", "label", "speedup"]
    assert "23,550,000" in out and "e+07" not in out
