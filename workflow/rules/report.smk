# Rules of the report stage (see the Snakefile index): one self-contained page, <root>/report.html (roots.smk), that
# sets every table and figure of the profile beside the paper's numbers, with a verdict per claim and provenance.



wildcard_constraints:  # every table, figure and page rule renders under a {root} (roots.smk; global: all rules)
    root="|".join(ROOTS),


REPORT_SECTIONS = [  # (title, artifact, caption): the page's order; captions are the snakemake --report captions
    ("Figure 2 (left): SimScore by depth", "figure2_simscore.png", "figure2_simscore.rst"),
    ("SimScore 0.5 crossings", "simscore_crossings.csv", "simscore_crossings.rst"),
    ("Figure 2 (right): prefill forward time", "figure2_forward_time.png", "figure2_forward_time.rst"),
    ("Table 1: prefill FLOPs", "table1.csv", "table1.rst"),
    ("KV-cache memory", "table_kv_memory.csv", "table_kv_memory.rst"),
    ("Distillation curve", "figure_distill_curve.png", "figure_distill_curve.rst"),
    *([("The benchmark suite: tasks chosen on the selection half", "suite_selection.csv", "suite_selection.rst")]
      if config["eval"]["suite"] == "bigbench" else []),
    ("Table 2: accuracy", "table2.csv", "accuracy_table.rst"),
    ("Table 4a: distillation loss", "table4a.csv", "accuracy_table.rst"),
    ("Table 4b: partial vs full training", "table4b.csv", "accuracy_table.rst"),
    ("Table B.1: FP8 KV cache", "tableB1.csv", "accuracy_table.rst"),
    ("Table B.2: MQA vs AcrossKV", "tableB2.csv", "accuracy_table.rst"),
    *([("Training seeds", "seeds.csv", "seeds.rst")] if SEEDS else []),  # profiles with the studies
    *([("The extended suite: MMLU + OLMES, every compared row", "extended_suite.csv", "extended_suite.rst")]
      if EXT else []),
    *([("Learning rate per training scope", "lr_sweep.csv", "lr_sweep.rst")] if LR_SWEEP else []),
    *([("Budget scaling", "figure_budget_scaling.png", "budget_scaling.rst"),
       ("Budget scaling: every number", "budget_scaling.csv", "budget_scaling.rst")] if SCALING else []),
    *([("Quality against prompt length", "figure_long_context.png", "long_context.rst"),
       ("Quality against prompt length: every number", "table_long_context.csv", "long_context.rst")]
      if LONG_CONTEXT else []),
    *([("Where to cut: the advisor", "figure_advisor.png", "advisor.rst"),
       ("The advisor: every candidate cut", "table_advisor.csv", "advisor.rst"),
       ("The advisor: calibration on the trained rows", "table_advisor_calibration.csv", "advisor.rst")]
      if ADVISE else []),
    ("Figure 3: throughput vs input length", "figure3_throughput.png", "figure3_throughput.rst"),
    ("Figure 4: latency vs request rate", "figure4_latency.png", "figure4_latency.rst"),
    ("Table 3: throughput under KV-cache limits", "table3.csv", "table3.rst"),
    ("Table A.3: ShareGPT input/output ratios", "tableA3.csv", "tableA3.rst"),
    *([("Served-model fidelity: vLLM plugin vs transformers", "table_serving_fidelity.csv",
        "table_serving_fidelity.rst")] if SERVED_FIDELITY else []),
]


REPORT_PROFILE = ", ".join(str(p) for p in workflow.configfiles) or "config/config.yaml"


def report_sections(root):
    """The page's sections under a root: (title, artifact path, caption file)."""
    return [(title, f"{root}/{name}", str(Path(workflow.basedir) / "workflow" / "report" / caption))
            for title, name, caption in REPORT_SECTIONS]


# The registered claims (analysis/claims.yaml) against this run's tables: one row per claim, its rule, every point,
# the verdict over all of them and whether this run decides it (<root>/claims.csv).
CLAIM_TABLES = ["table1", "table_kv_memory", "simscore_crossings", "table2", "table4a", "table4b", "tableB1", "tableB2",
                *(["seeds"] if SEEDS else []), *(["budget_scaling"] if SCALING else []), "table3", "tableA3",
                *(["table_advisor_calibration"] if ADVISE else []),
                *(["table_long_context"] if LONG_CONTEXT else []),
                *(["table_serving_fidelity"] if SERVED_FIDELITY else []),
                *(["extended_suite"] if EXT else [])]
rule make_claims:
    input:
        registry="analysis/claims.yaml",
        tables=expand("{{root}}/{name}.csv", name=CLAIM_TABLES),
        # the serving claims read every repeat and request (analysis/evidence.py)
        serving=[serving_raw(study, "{root}") for study in SERVE_STUDIES if serve_results(study)],
        forward_time="{root}/raw/forward_time",  # the prefill-time claims read every repeat
    output:
        "{root}/claims.csv",
    log:
        "logs/make_claims/{root}.log",
    params:
        # the registry names the default profile's points; another profile is judged on the points it measures
        registered_points=config["profile"] == "default",
    script:
        "../scripts/make_claims.py"


def report_inputs(wildcards):
    """render_report's inputs under the job's root: every section's artifact, the claims, the provenance record,
    what the disagreements quote of this setting (the timings' hardware, the students' training budget), and the
    captions (read by the script: declared)."""
    root = wildcards.root
    paths = {Path(name).stem: f"{root}/{name}" for _, name, _ in REPORT_SECTIONS}
    paths.update(registry=f"{root}/claims.csv", provenance=f"{root}/provenance.json",
                 forward_time=f"{root}/raw/forward_time")
    return {**paths, "captions": sorted({caption for _, _, caption in report_sections(root)}),
            "seeds_raw": [f"{root}/raw/seeds"] if SEEDS else [],
            "extended_agreement": [f"{root}/{EXT_FOLDER}/agreement.csv"] if EXT else []}


from analysis.readme import DEFAULT_TITLE as README_DEFAULT_TITLE  # the committed page's (python -m analysis.readme)

REPORT_TITLES = {  # per profile: the page's title, and the markdown page's
    "html": {"default": "SwiftKV re-tested in miniature (small embedded models on a CPU): the paper's tables and "
             "figures beside this profile's, every claim judged by a registered rule",
             "ci": "SwiftKV pipeline check (CI profile, tiny sizes): the numbers say nothing about the paper",
             "paper": "SwiftKV at the paper's scale (paper profile): the paper's tables and figures beside this "
             "run's, every claim judged by a registered rule"}[config["profile"]],
    "markdown": {"default": README_DEFAULT_TITLE,
                 "ci": "SwiftKV pipeline check (CI profile, tiny sizes): the numbers say nothing about the paper",
                 "paper": "SwiftKV at the paper's scale (paper profile): the measured numbers, every claim judged by "
                 "a registered rule"}[config["profile"]],
}


def readme_labels():
    """How the markdown page names rows (analysis.readme.profile_labels of this profile and its variants sheet)."""
    from analysis.readme import profile_labels

    labels = profile_labels(config, VARIANTS)
    return dict(variant_labels=labels.variants, scaling_labels=labels.scaling)


# The measured numbers in markdown (<root>/README.md), from the same files as the page: GitHub shows them where the
# results are, and the project's README.md never changes when a number does.
rule render_readme:
    input:
        unpack(report_inputs),
        distill_curve="{root}/raw/distill_curve",
        serving=[serving_raw(study, "{root}") for study in SERVE_STUDIES if serve_results(study)],
    output:
        "{root}/README.md",
    log:
        "logs/render_readme/{root}.log",
    params:
        title=REPORT_TITLES["markdown"],
        **readme_labels(),
    script:
        "../scripts/render_readme.py"


rule render_report:
    input:
        unpack(report_inputs),
        readme="{root}/README.md",  # built with the page: one target renders both
    output:
        report("{root}/report.html", caption="../report/report.rst", category="Report"),
    log:
        "logs/render_report/{root}.log",
    params:
        title=REPORT_TITLES["html"],
        sections=lambda w: report_sections(w.root),
        ci=config["profile"] == "ci",
    script:
        "../scripts/render_report.py"


def vllm_env_input(wildcards):
    """The versions of the vLLM environments the profile serves with, for the run's provenance (serve.smk)."""
    return vllm_env_records()


# Where the run's tables came from (commit, profile and its hash, hardware, versions, date, job times; each raw
# folder's commits): written after the claims, so that it describes the run that rendered them. The committed
# reports/provenance.json is written by no rule: python -m analysis.publish copies the published run's.
rule write_provenance:
    input:
        claims=f"{RUN}/claims.csv",
        vllm_env=vllm_env_input,
        # the extended suite's task choice, which no table reads (its students' evaluations do): collected with the
        # run's other raw folders, whose summary lists it
        extended_selection=[f"{RUN}/raw/extended_selection"] if EXT else [],
    output:
        f"{RUN}/provenance.json",
    log:
        "logs/write_provenance.log",
    params:
        profile=REPORT_PROFILE,
        config_hash=config_hash(),
    script:
        "../scripts/write_provenance.py"
