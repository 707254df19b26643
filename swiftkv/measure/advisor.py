"""Where to cut (issue 18, part 2): ``swiftkv advise MODEL`` before any training budget is spent.

For every candidate (l, g) — l from a list of skipped fractions, g an AcrossKV group size that divides L - l — it
measures, on held-out ShareGPT conversations and with no training:

- SimScore at l (paper Eq. 1, and the two diagnostics of ``swiftkv.measure.simscore``), with its bootstrap interval;
- the untrained student's KL(teacher || student) per token (T = 1, teacher-forced, the reference init of
  ``swiftkv.models.convert``: exactly the student a distillation run starts from) and its top-1 agreement, with a bootstrap
  interval over conversations;
- the prefill FLOPs and KV-cache bytes it saves (``swiftkv.measure.flops``).

Candidates that no other candidate beats on both saved FLOPs and untrained KL form the Pareto front.

Calibration: given trained students of the same model (their (l, g) and held-out KL, e.g. Table 2's rows), the
Spearman rank correlation between each predictor (untrained KL, SimScore) and the trained KL, with a bootstrap
interval over the trained points, and a log-log line from untrained to trained KL. The advice for a tolerance on
trained held-out KL is the candidate that saves the most prefill FLOPs whose trained KL is within it: measured where
the cut was trained, predicted by the line elsewhere; how much to trust it is the calibration's correlation interval
and its number of points (without calibration, the untrained KL itself is held to the tolerance: training lowers KL,
so that choice errs on the safe side).
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from swiftkv.errors import SwiftKVError

logger = logging.getLogger(__name__)

DEFAULT_SKIPS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75)
PREDICTORS = ("untrained_kl", "simscore")  # what the calibration correlates with trained KL
MIN_CALIBRATION = 3  # trained points needed for a rank correlation


@dataclass
class AdvisorSettings:
    skips: tuple[float, ...] = DEFAULT_SKIPS  # fractions of layers whose prompt tokens stop early (l = L(1 - s))
    group_sizes: tuple[int, ...] = (1,)  # AcrossKV g at each l (those that divide L - l)
    num_sequences: int = 32  # held-out conversations, teacher-forced (and for SimScore)
    max_tokens: int = 256  # tokens per conversation
    batch_size: int = 4
    context_length: int = 4096  # prompt length of the FLOPs column (Table 1's convention)
    n_resamples: int = 2000
    confidence_level: float = 0.95
    seed: int = 0


@dataclass(frozen=True)
class Candidate:
    num_key_value_layers: int
    key_value_group_size: int = 1

    @property
    def label(self) -> str:
        return f"l={self.num_key_value_layers}" + (f", g={self.key_value_group_size}"
                                                   if self.key_value_group_size > 1 else "")


@dataclass
class TrainedPoint:
    """A trained student of the advised model: its cut and its held-out KL to the teacher (lo, hi: its interval)."""
    label: str
    num_key_value_layers: int
    key_value_group_size: int
    kl: float
    kl_lo: float = math.nan
    kl_hi: float = math.nan


def candidates(num_layers: int, settings: AdvisorSettings) -> list[Candidate]:
    """Every (l, g) of the settings, deduplicated, in order of l (descending: least skipped first) then g; a g that
    does not divide L - l is left out."""
    from swiftkv.measure.flops import layers_for_skip

    if num_layers < 2:
        raise SwiftKVError(f"a model needs at least 2 layers to be cut; this one has {num_layers}")
    bad = [s for s in settings.skips if not 0 < s < 1]
    if bad:
        raise SwiftKVError(f"skipped fraction {bad[0]} is not between 0 and 1 (e.g. 0.5 for SwiftKV 50%)")
    bad_g = [g for g in settings.group_sizes if g < 1]
    if bad_g:
        raise SwiftKVError(f"AcrossKV group size {bad_g[0]} must be >= 1")
    out = []
    for l in sorted({min(num_layers - 1, layers_for_skip(num_layers, s)) for s in settings.skips}, reverse=True):
        out += [Candidate(l, g) for g in sorted(set(settings.group_sizes)) if (num_layers - l) % g == 0]
    return out


def pareto_front(rows: list[dict], saved: str = "prefill_saved", loss: str = "untrained_kl") -> list[bool]:
    """True for each row no other row beats: at least as much saved and at most as much loss, one of them strictly."""
    front = []
    for r in rows:
        beaten = any(o[saved] >= r[saved] and o[loss] <= r[loss] and (o[saved] > r[saved] or o[loss] < r[loss])
                     for o in rows if o is not r)
        front.append(not beaten)
    return front


def measure_candidates(model, tokenizer, conversations, settings: AdvisorSettings, progress: bool = True) -> dict:
    """Every candidate's SimScore, untrained KL / top-1 and savings (one row each), on ``model`` (a base model)."""
    import time

    import torch
    from tqdm.auto import tqdm

    from swiftkv.measure.fidelity import teacher_forced, teacher_forced_sequences
    from swiftkv.measure.flops import flops_report
    from swiftkv.measure.simscore import SimScoreSettings, bootstrap_ci, measure_simscore
    from swiftkv.models.convert import convert_to_swiftkv

    if getattr(model.config, "swiftkv", None) is not None:
        raise SwiftKVError("give the advisor a base model, not a SwiftKV checkpoint: it converts each candidate itself")
    L = model.config.num_hidden_layers
    cands = candidates(L, settings)
    if not cands:
        raise SwiftKVError(f"no candidate: no group size of {list(settings.group_sizes)} divides L - l for the "
                           f"skipped fractions given ({L} layers); add g = 1")
    t0 = time.perf_counter()
    sim = measure_simscore(model, tokenizer, conversations,
                           SimScoreSettings(num_sequences=settings.num_sequences, max_tokens=settings.max_tokens,
                                            seed=settings.seed, n_resamples=settings.n_resamples,
                                            confidence_level=settings.confidence_level), progress=progress)
    by_layer = {(r["metric"], r["layer"]): r for r in sim["rows"]}
    boot = SimScoreSettings(n_resamples=settings.n_resamples, confidence_level=settings.confidence_level,
                            seed=settings.seed, ci_method="percentile")
    seqs = teacher_forced_sequences(tokenizer, conversations, settings.num_sequences, settings.max_tokens)
    if len(seqs) < 2:
        raise SwiftKVError(f"only {len(seqs)} held-out conversation(s) of >= 16 tokens; the advisor needs >= 2")
    rows = []
    for cand in tqdm(cands, desc="advise: candidates", disable=not progress):
        student = convert_to_swiftkv(model, cand.num_key_value_layers, cand.key_value_group_size)
        student.eval()
        with torch.inference_mode():
            per_seq = teacher_forced(model, student, seqs, settings.batch_size, progress=False)
        # per-token means of KL and top-1 (sums over sequences / tokens) with their bootstrap over sequences,
        # the same ratio-of-sums interval as SimScore's (percentile)
        tokens = np.array([r["tokens"] for r in per_seq], dtype=float)
        sums = np.array([[r["kl_sum"], r["top1_agree"]] for r in per_seq])
        est = sums.sum(axis=0) / tokens.sum()
        low, high = bootstrap_ci(sums, tokens, boot)
        kl, top1 = (float(est[0]), float(low[0]), float(high[0])), (float(est[1]), float(low[1]), float(high[1]))
        report = flops_report(model.config, cand.num_key_value_layers, cand.key_value_group_size,
                              settings.context_length)
        l = cand.num_key_value_layers
        row = {"candidate": cand.label, "num_key_value_layers": l, "key_value_group_size": cand.key_value_group_size,
               "num_layers": L, "skipped": (L - l) / L,
               "untrained_kl": kl[0], "untrained_kl_lo": kl[1], "untrained_kl_hi": kl[2],
               "untrained_top1": top1[0], "untrained_top1_lo": top1[1], "untrained_top1_hi": top1[2],
               "prefill_saved": report["prefill_reduction"], "kv_saved": report["kv_cache_reduction"]}
        for metric in ("cosine", "centred", "no_outliers"):  # Eq. 1 has no later layer at l = L - 1: nan there
            s = by_layer.get((metric, l), {"simscore": math.nan, "ci_low": math.nan, "ci_high": math.nan})
            name = "simscore" if metric == "cosine" else f"simscore_{metric}"
            row.update({name: s["simscore"], f"{name}_lo": s["ci_low"], f"{name}_hi": s["ci_high"]})
        rows.append(row)
        del student
    for row, front in zip(rows, pareto_front(rows)):
        row["pareto"] = front
    return {"settings": asdict(settings), "num_layers": L, "num_sequences": len(seqs),
            "num_tokens": int(sum(len(s) for s in seqs)), "simscore_sequences": sim["num_sequences"],
            "seconds": time.perf_counter() - t0, "rows": rows}


# -- calibration against trained students ------------------------------------------------------------------------


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if len(set(x.tolist())) < 2 or len(set(y.tolist())) < 2:
        return math.nan
    return float(spearmanr(x, y).statistic)


@dataclass
class Calibration:
    """How well a predictor ranks the trained students: Spearman rho with its bootstrap interval over the trained
    points, and n; plus the log-log line trained_kl = a * untrained_kl^b used to predict."""
    n: int
    rho: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # predictor -> (rho, lo, hi)
    slope: float = math.nan  # b
    intercept: float = math.nan  # log a
    residual_sd: float = math.nan  # of log trained KL around the line
    points: list[dict] = field(default_factory=list)

    @property
    def distinct_l(self) -> int:
        """How many distinct cuts l the trained points cover (rows of one l with other g are not other cuts)."""
        return len({p["num_key_value_layers"] for p in self.points})

    def predict(self, untrained_kl: float) -> float:
        if math.isnan(self.slope) or not untrained_kl > 0:
            return math.nan
        return math.exp(self.intercept + self.slope * math.log(untrained_kl))


def calibrate(rows: list[dict], trained: list[TrainedPoint], settings: AdvisorSettings) -> Calibration:
    """Match each trained point to the advisor's measurement at its (l, g) (SimScore needs only l) and correlate.

    A trained (l, g) that the advisor did not measure is left out with a warning (add its skipped fraction)."""
    by_cut = {(r["num_key_value_layers"], r["key_value_group_size"]): r for r in rows}
    points = []
    for t in trained:
        row = by_cut.get((t.num_key_value_layers, t.key_value_group_size))
        if row is None:
            logger.warning("trained %s (l=%d, g=%d) has no advisor candidate; add its skipped fraction to calibrate "
                           "on it", t.label, t.num_key_value_layers, t.key_value_group_size)
            continue
        points.append({"label": t.label, "num_key_value_layers": t.num_key_value_layers,
                       "key_value_group_size": t.key_value_group_size, "trained_kl": t.kl,
                       "trained_kl_lo": t.kl_lo, "trained_kl_hi": t.kl_hi,
                       "untrained_kl": row["untrained_kl"], "simscore": row["simscore"]})
    cal = Calibration(n=len(points), points=points)
    if len(points) < MIN_CALIBRATION:
        return cal
    y = np.array([p["trained_kl"] for p in points])
    rng = np.random.default_rng(settings.seed)
    a = (1 - settings.confidence_level) / 2
    for pred in PREDICTORS:
        x = np.array([p[pred] for p in points], dtype=float)
        ok = ~np.isnan(x)  # SimScore is undefined at l = L - 1
        if ok.sum() < MIN_CALIBRATION:
            cal.rho[pred] = (math.nan,) * 3
            continue
        x, yy = x[ok], y[ok]
        idx = rng.integers(0, len(x), size=(settings.n_resamples, len(x)))
        boots = np.array([_spearman(x[i], yy[i]) for i in idx])
        boots = boots[~np.isnan(boots)]  # resamples of a single distinct point have no rank order
        lo, hi = (float(np.quantile(boots, a)), float(np.quantile(boots, 1 - a))) if len(boots) else (math.nan,) * 2
        cal.rho[pred] = (_spearman(x, yy), lo, hi)
    x = np.array([p["untrained_kl"] for p in points])
    if (x > 0).all() and (y > 0).all() and len(set(x.tolist())) > 1:
        b, loga = np.polyfit(np.log(x), np.log(y), 1)
        cal.slope, cal.intercept = float(b), float(loga)
        resid = np.log(y) - (loga + b * np.log(x))
        cal.residual_sd = float(np.sqrt((resid ** 2).sum() / max(1, len(x) - 2)))
    return cal


def trust(cal: Calibration) -> str:
    """How much to trust the advice, in words, from the calibration of the untrained KL."""
    if cal.n < MIN_CALIBRATION:
        return (f"uncalibrated: {cal.n} trained cut(s) of this model (a rank correlation needs "
                f">= {MIN_CALIBRATION}); the advice holds the untrained KL to the tolerance, which errs on the safe side")
    rho, lo, hi = cal.rho["untrained_kl"]
    verdict = ("the untrained KL ranks the trained students (interval above 0)" if lo > 0 else
               "the untrained KL does not rank the trained students reliably (interval reaches 0 or below)")
    few = (" (few rows: when they rank alike every resample does, so the interval is coarse)"
           if cal.n < 2 * MIN_CALIBRATION + 2 else "")
    return (f"{verdict}: Spearman {rho:.2f} [{lo:.2f}, {hi:.2f}] over {cal.n} trained rows at {cal.distinct_l} "
            f"distinct cuts l{few}")


def advise(rows: list[dict], tolerance: float, cal: Calibration | None = None) -> dict:
    """The candidate that saves the most prefill FLOPs with trained KL <= ``tolerance`` (nats/token): measured where
    the cut was trained (a calibration point), else predicted by the calibration line where there is one, else the
    untrained KL itself (``prediction_basis``: trained / calibrated / untrained)."""
    if not tolerance > 0:
        raise SwiftKVError(f"--tolerance {tolerance}: give the largest held-out KL to the teacher you accept "
                           "(nats/token, > 0), e.g. 0.5")
    calibrated = cal is not None and not math.isnan(cal.slope)
    measured = {(p["num_key_value_layers"], p["key_value_group_size"]): p["trained_kl"] for p in (cal.points if cal
                                                                                                  else [])}
    scored = []
    for r in rows:
        cut = (r["num_key_value_layers"], r["key_value_group_size"])
        if cut in measured:
            predicted, basis = measured[cut], "trained"
        elif calibrated:
            predicted, basis = cal.predict(r["untrained_kl"]), "calibrated"
        else:
            predicted, basis = r["untrained_kl"], "untrained"
        scored.append({**r, "predicted_trained_kl": predicted, "prediction_basis": basis})
    ok = [r for r in scored if r["predicted_trained_kl"] <= tolerance]
    best = max(ok, key=lambda r: (r["prefill_saved"], r["kv_saved"], -r["predicted_trained_kl"])) if ok else None
    return {"tolerance": tolerance, "calibrated": calibrated, "rows": scored,
            "recommended": None if best is None else best["candidate"],
            "trust": trust(cal or Calibration(n=0))}
