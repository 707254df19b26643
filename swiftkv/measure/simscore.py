"""SimScore (paper Eq. 1): how well the input of layer l stands in for the inputs of every later layer.

    SimScore(x_l) = 1 / (L - 1 - l) * sum_{j = l+1}^{L-1} Sim(x_l, x_j),   Sim = cosine similarity of x_l^(i) and
                                                                           x_j^(i) averaged over token positions i

with x_l the residual stream entering layer l (0-based), i.e. what SwiftKV with ``num_key_value_layers = l`` turns
into the K/V of every later layer. ``x_0`` is the embedding output; ``l`` runs over 0 .. L-2 (the input of the
last layer has no later layer). The paper's 1-based layer l+1 is our l.

Token averages pool all non-padding tokens of the sample (the paper's "average over all tokens"); the confidence
interval is a bootstrap over sequences (``scipy.stats.bootstrap``, paired per-sequence sums and token counts).

Beside the paper's cosine two diagnostics, computed on the same hidden states:

- ``centred``: cosine after removing, per sequence and layer, the mean over tokens of x_l. A few outlier dimensions
  carry a large, token-independent offset in small models; removing it measures whether the *token-specific*
  content of x_l matches that of later layers.
- ``no_outliers``: cosine after dropping the ``outlier_dims`` dimensions that carry the largest share of the
  squared norm (per sequence, averaged over layers), i.e. whether the paper's number is carried by those few dims.

Both diagnostics leave out the first position (``sink_tokens``): in all three embedded models the first token
(BOS / ``<|im_start|>``) carries massive activations (SmolLM2 from layer 12: norm ~25,000 against a median of
~140), which would dominate a token mean and the outlier ranking. The paper's cosine keeps every token.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from swiftkv.errors import SwiftKVError

logger = logging.getLogger(__name__)

METRICS = ("cosine", "centred", "no_outliers")
EPS = 1e-12


@dataclass
class SimScoreSettings:
    num_sequences: int = 64
    max_tokens: int = 1024
    seed: int = 0
    batch_size: int = 1
    outlier_dims: int = 4  # dims dropped by the no_outliers diagnostic
    sink_tokens: int = 1  # first positions left out of the diagnostics (massive activations)
    n_resamples: int = 2000
    confidence_level: float = 0.95
    ci_method: str = "BCa"  # scipy.stats.bootstrap method (falls back to percentile where BCa is undefined)
    min_tokens: int = 16  # conversations that render shorter are skipped


# --------------------------------------------------------------------------------------------------------------
# The statistic on hidden states (pure torch, no model)


def layer_inputs(hidden_states: tuple | list, num_layers: int) -> torch.Tensor:
    """Stack the inputs of layers 0..L-1 from ``output_hidden_states`` (L+1 entries; the last is the normed output)."""
    if len(hidden_states) != num_layers + 1:
        raise SwiftKVError(f"expected {num_layers + 1} hidden states for {num_layers} layers, got {len(hidden_states)}")
    return torch.stack(list(hidden_states[:num_layers]))  # (L, B, T, D)


def _cosine_pair_sums(h: torch.Tensor) -> torch.Tensor:
    """h: (L, T, D) of one sequence's real tokens -> (L, L) sums over tokens of cos(h_l^i, h_j^i)."""
    hn = h / h.norm(dim=-1, keepdim=True).clamp_min(EPS)  # (L, T, D)
    return torch.einsum("ltd,mtd->lm", hn, hn)  # (L, L)


def outlier_dimensions(h: torch.Tensor, k: int) -> torch.Tensor:
    """The k dims with the largest share of the squared norm, averaged over layers. h: (L, T, D) -> (k,)."""
    sq = h.pow(2).sum(dim=1)  # (L, D)
    share = sq / sq.sum(dim=-1, keepdim=True).clamp_min(EPS)  # (L, D)
    return share.mean(dim=0).topk(min(k, h.shape[-1] - 1)).indices  # keep at least one dim


def sequence_pair_sums(
    h: torch.Tensor, outlier_dims: int = 4, sink_tokens: int = 1
) -> tuple[dict[str, torch.Tensor], dict[str, int], torch.Tensor]:
    """Per-metric (L, L) token sums of the pairwise cosine for one sequence h: (L, T, D) of real tokens only.

    The paper's cosine uses every token; the diagnostics leave out the first ``sink_tokens`` positions, whose
    massive activations (100x the median norm in the embedded models) would otherwise dominate the token mean
    and the outlier ranking. Returns (sums, tokens counted per metric, the outlier dims dropped).
    """
    h = h.float()
    out = {"cosine": _cosine_pair_sums(h)}
    counts = {"cosine": h.shape[1]}
    rest = h[:, sink_tokens:] if h.shape[1] > sink_tokens else h
    out["centred"] = _cosine_pair_sums(rest - rest.mean(dim=1, keepdim=True))
    dims = outlier_dimensions(rest, outlier_dims) if outlier_dims > 0 else torch.empty(0, dtype=torch.long)
    keep = torch.ones(h.shape[-1], dtype=torch.bool)
    keep[dims] = False
    out["no_outliers"] = _cosine_pair_sums(rest[..., keep])
    counts["centred"] = counts["no_outliers"] = rest.shape[1]
    return out, counts, dims


def simscore_from_pairs(pairs: torch.Tensor | np.ndarray) -> np.ndarray:
    """(..., L, L) pairwise similarities (or token sums of them) -> (..., L-1): mean over j > l, for l = 0..L-2."""
    pairs = np.asarray(pairs, dtype=np.float64)
    L = pairs.shape[-1]
    upper = np.triu(np.ones((L, L)), k=1)  # j > l
    sums = (pairs * upper).sum(axis=-1)[..., : L - 1]
    return sums / (L - 1 - np.arange(L - 1))


def simscore(
    hidden: torch.Tensor, mask: torch.Tensor | None = None, outlier_dims: int = 4, sink_tokens: int = 1
) -> dict[str, np.ndarray]:
    """SimScore per metric for a batch. hidden: (L, B, T, D) layer inputs; mask: (B, T), 1 = real token.

    Returns per metric the token-pooled SimScore (L-1,) over the whole batch.
    """
    acc = accumulate(hidden, mask, outlier_dims, sink_tokens)
    return {m: acc[m].sum(axis=0) / acc["tokens"][m].sum() for m in METRICS}


def accumulate(hidden: torch.Tensor, mask: torch.Tensor | None, outlier_dims: int = 4, sink_tokens: int = 1) -> dict:
    """Per-sequence token sums of SimScore (B, L-1) and token counts (B,) for each metric, and the outlier dims."""
    L, B, T, _ = hidden.shape
    if mask is None:
        mask = torch.ones(B, T, dtype=torch.long)
    out = {m: [] for m in METRICS}
    tokens = {m: [] for m in METRICS}
    outliers = []
    for b in range(B):
        real = mask[b].bool()
        if int(real.sum()) == 0:
            continue
        pairs, counts, dims = sequence_pair_sums(hidden[:, b, real], outlier_dims, sink_tokens)  # padding excluded
        for m in METRICS:
            out[m].append(simscore_from_pairs(pairs[m].cpu().numpy()))
            tokens[m].append(counts[m])
        outliers.append(dims.tolist())
    result = {m: np.stack(out[m]) if out[m] else np.zeros((0, L - 1)) for m in METRICS}
    result["tokens"] = {m: np.asarray(tokens[m], dtype=np.float64) for m in METRICS}
    result["outliers"] = outliers
    return result


def bootstrap_ci(sums: np.ndarray, tokens: np.ndarray, settings: SimScoreSettings) -> tuple[np.ndarray, np.ndarray]:
    """CI of sum(sums) / sum(tokens) per column, resampling sequences (rows). sums: (S, K), tokens: (S,)."""
    from scipy.stats import bootstrap

    low, high = np.full(sums.shape[1], np.nan), np.full(sums.shape[1], np.nan)
    if len(tokens) < 2:
        return low, high

    def ratio(s, n, axis=-1):
        return s.sum(axis=axis) / n.sum(axis=axis)

    rng = np.random.default_rng(settings.seed)
    for k in range(sums.shape[1]):
        for method in dict.fromkeys((settings.ci_method, "percentile")):
            with np.errstate(all="ignore"):
                res = bootstrap((sums[:, k], tokens), ratio, paired=True, vectorized=True, method=method,
                                n_resamples=settings.n_resamples, confidence_level=settings.confidence_level,
                                random_state=rng)
            ci = res.confidence_interval
            if np.isfinite(ci.low) and np.isfinite(ci.high):
                low[k], high[k] = ci.low, ci.high
                break
    return low, high


# --------------------------------------------------------------------------------------------------------------
# Text: held-out ShareGPT conversations rendered as each model sees them


def render(tokenizer, messages: list[dict[str, str]]) -> tuple[str, bool]:
    """(text, used_chat_template). Models without a chat template get 'User: ...' / 'Assistant: ...' turns."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False), True
    names = {"user": "User", "assistant": "Assistant", "system": "System"}
    return "\n\n".join(f"{names.get(m['role'], m['role'].title())}: {m['content']}" for m in messages), False


def encode_sample(tokenizer, conversations, settings: SimScoreSettings) -> tuple[list[list[int]], list[str], bool]:
    """Seeded sample of conversations, rendered and truncated to ``max_tokens``: (token ids, conversation ids, templated)."""
    order = list(range(len(conversations)))
    random.Random(settings.seed).shuffle(order)
    seqs, ids, templated = [], [], True
    for i in order:
        conv = conversations[i]
        text, templated = render(tokenizer, conv.messages)
        # a chat template writes its own special tokens; plain text gets the tokenizer's (e.g. Gemma's BOS)
        enc = tokenizer(text, add_special_tokens=not templated, truncation=True, max_length=settings.max_tokens)
        if len(enc["input_ids"]) < settings.min_tokens:
            continue
        seqs.append(list(enc["input_ids"]))
        ids.append(conv.id)
        if len(seqs) == settings.num_sequences:
            break
    if len(seqs) < settings.num_sequences:
        raise SwiftKVError(
            f"only {len(seqs)} of {len(conversations)} conversations render to >= {settings.min_tokens} tokens; "
            f"ask for fewer sequences (--num-sequences {len(seqs)})"
        )
    return seqs, ids, templated


def batches(seqs: list[list[int]], batch_size: int, pad_id: int):
    """Length-sorted right-padded batches: (input_ids (B, T), attention_mask (B, T))."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    for start in range(0, len(order), batch_size):
        chunk = [seqs[i] for i in order[start : start + batch_size]]
        T = max(len(s) for s in chunk)
        ids = torch.full((len(chunk), T), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), T), dtype=torch.long)
        for b, s in enumerate(chunk):
            ids[b, : len(s)] = torch.tensor(s)
            mask[b, : len(s)] = 1
        yield ids, mask


# --------------------------------------------------------------------------------------------------------------
# The measurement


def decoder(model):
    """The base decoder (no LM head: Gemma-3's 262k-row head would dominate the cost) and its layer count."""
    inner = getattr(model, "model", model)
    config = getattr(inner, "config", model.config)
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    if hasattr(model, "swiftkv"):
        model.swiftkv(False)  # a SwiftKV checkpoint: measure its teacher wiring
    return inner, config.num_hidden_layers


@torch.inference_mode()
def measure_simscore(model, tokenizer, conversations, settings: SimScoreSettings, progress: bool = True) -> dict:
    """SimScore (+ diagnostics) with bootstrap CIs for ``model`` on a seeded sample of ``conversations``."""
    inner, L = decoder(model)
    if L < 2:
        raise SwiftKVError(f"SimScore needs at least 2 layers, the model has {L}")
    device = next(inner.parameters()).device
    seqs, conv_ids, templated = encode_sample(tokenizer, conversations, settings)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    parts = {m: [] for m in METRICS}
    tokens, outliers = {m: [] for m in METRICS}, Counter()
    t0 = time.perf_counter()
    bar = tqdm(total=sum(len(s) for s in seqs), desc="simscore", unit="tok", disable=not progress)
    for ids, mask in batches(seqs, settings.batch_size, pad_id):
        out = inner(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True, use_cache=False)
        hidden = layer_inputs(out.hidden_states, L).float().cpu()  # (L, B, T, D)
        acc = accumulate(hidden, mask, settings.outlier_dims, settings.sink_tokens)
        for m in METRICS:
            parts[m].append(acc[m])
            tokens[m].append(acc["tokens"][m])
        outliers.update(d for dims in acc["outliers"] for d in dims)
        bar.update(int(mask.sum()))
    bar.close()
    elapsed = time.perf_counter() - t0
    tokens = {m: np.concatenate(tokens[m]) for m in METRICS}
    rows = []
    for m in METRICS:
        sums = np.concatenate(parts[m])  # (S, L-1)
        value = sums.sum(axis=0) / tokens[m].sum()
        low, high = bootstrap_ci(sums, tokens[m], settings)
        for l in range(L - 1):
            rows.append({"metric": m, "layer": l, "num_layers": L, "depth": l / L, "simscore": float(value[l]),
                         "ci_low": float(low[l]), "ci_high": float(high[l]), "tokens": int(tokens[m].sum())})
    return {
        "rows": rows,
        "num_layers": L,
        "num_sequences": len(seqs),
        "num_tokens": int(tokens["cosine"].sum()),
        "tokens_per_sequence": {"min": int(tokens["cosine"].min()), "median": float(np.median(tokens["cosine"])),
                                "max": int(tokens["cosine"].max())},
        "chat_template": templated,
        "rendering": "tokenizer chat template" if templated else "plain text turns 'User: ...' / 'Assistant: ...' (no chat template)",
        "conversation_ids": conv_ids,
        "outlier_dims_most_common": [[int(d), c] for d, c in outliers.most_common(2 * settings.outlier_dims)],
        "seconds": elapsed,
        "tokens_per_second": float(tokens["cosine"].sum()) / elapsed if elapsed > 0 else None,
        "settings": asdict(settings),
    }



def write_simscore(result: dict, name: str, csv_path: str | Path, metadata_path: str | Path, metadata: dict,
                   overwrite: bool = False):
    """Save a ``measure_simscore`` result: its rows as a CSV (one per metric and layer, ``model`` = ``name``) and
    the rest, with ``metadata`` (source, dtype, device ...), as a JSON beside it. Returns the table."""
    import pandas as pd

    from swiftkv.io import atomic_path, write_json

    result = dict(result)
    table = pd.DataFrame(result.pop("rows"))
    table.insert(0, "model", name)
    with atomic_path(csv_path, overwrite=overwrite) as tmp:
        table.to_csv(tmp, index=False)
    write_json(metadata_path, {"model": name, **metadata, **result}, overwrite=overwrite)
    return table
