"""Adapter for rule make_table: evaluation results of a table's rows -> reports/<table>.csv and .md."""
import json
import logging

from analysis.stats import BootstrapSettings
from analysis.accuracy import CAPTIONS, Row, build_table, task_label, to_markdown
from swiftkv.io import write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)
table, boot = snakemake.wildcards.table, snakemake.params.bootstrap
rows = [Row(r["model"], r["variant"], r["kv_cache"], r["spec"], lm, fid)
        for r, lm, fid in zip(snakemake.params.rows, snakemake.input.lm_eval, snakemake.input.fidelity)]
tasks = {}
for path in snakemake.input.tasks:
    model = path.split("/")[-2]
    with open(path) as f:
        tasks[model] = json.load(f)["tasks"]
df = build_table(table, rows, tasks, BootstrapSettings(boot["resamples"], boot["confidence"], boot["seed"]))
write_text(snakemake.output.csv, df.to_csv(index=False, float_format="%.4f"))
labels = list(dict.fromkeys(task_label(t["name"]) for ts in tasks.values() for t in ts))
notes = [f"{model}: {task_label(t['name'])} ({t['metric'].split(',')[0]}, n={t.get('n', '?')}"
         + (f", chance {100 * t['chance']:.1f}%" if "chance" in t else "")
         + (f", {t['selected_by']}" if t.get("selected_by", "interval above chance") != "interval above chance" else "")
         + ")" for model, ts in tasks.items() for t in ts]
write_text(snakemake.output.md, to_markdown(df, labels, CAPTIONS[table], notes))
