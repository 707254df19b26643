"""TEMPORARY adapter (until rule distill_swiftkv of issue 4 is merged): an untrained SwiftKV checkpoint of one sheet
row at the contract path. MQA rows get their fewer K/V heads by averaging the AcrossKV leader's heads in groups."""
import csv
import logging

import torch

from swiftkv.cli import _save_pretrained_atomic
from swiftkv.convert import convert_to_swiftkv
from swiftkv.loading import load_model

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)
w = snakemake.wildcards
with open(snakemake.params.sheet, newline="") as f:
    row = next(r for r in csv.DictReader(f, delimiter="\t") if (r["model"], r["variant"]) == (w.model, w.variant))
model, tokenizer = load_model(snakemake.input[0])
student = convert_to_swiftkv(model, int(row["num_key_value_layers"]), int(row["key_value_group_size"]))
if row["kv_heads"]:
    heads, cfg = int(row["kv_heads"]), student.config
    for layer in student.model.layers[cfg.num_key_value_layers :: cfg.key_value_group_size]:
        attn = layer.self_attn
        for name in ("k_proj_swiftkv", "v_proj_swiftkv"):
            lin = getattr(attn, name)
            w_ = lin.weight.data.view(heads, -1, attn.head_dim, lin.in_features).mean(1).reshape(-1, lin.in_features)
            pooled = torch.nn.Linear(lin.in_features, w_.shape[0], bias=lin.bias is not None)
            pooled.weight.data.copy_(w_)
            if lin.bias is not None:
                pooled.bias.data.copy_(lin.bias.data.view(heads, -1, attn.head_dim).mean(1).reshape(-1))
            setattr(attn, name, pooled)
        attn.swiftkv_num_key_value_groups = cfg.num_attention_heads // heads
    cfg.swiftkv_key_value_heads = heads
_save_pretrained_atomic(student, tokenizer, snakemake.output[0])
logging.info("untrained %s/%s (l=%s, g=%s, kv_heads=%s)", w.model, w.variant, row["num_key_value_layers"],
             row["key_value_group_size"], row["kv_heads"] or "-")
