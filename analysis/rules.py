"""How a registered claim (``analysis/claims.yaml``) is judged: a rule (``Rule``) applied to the estimate and 95%
interval of every measured point (``Point``).

A rule never looks at a subset of the points: ``decide`` takes all of them and returns the worst of their
verdicts, so the verdict over all points is never better than over any subset — no choice of points can make a
claim look better than the full set does (``tests/test_claims.py`` checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HOLDS, FAILS, UNCLEAR = "holds", "does not hold", "cannot tell"
DISAGREE = "measures disagree"  # co-primary measures, one holding and the other not (co_primary)
KINDS = ("direction", "margin", "exact", "every_point")


@dataclass(frozen=True)
class Rule:
    kind: str
    direction: str = "above"  # direction / every_point: the effect must lie above (or below) the threshold
    threshold: float = 0.0
    margin: float = 0.0  # margin: the largest loss the claim allows
    tolerance: float = 0.0  # exact
    per_row: bool = False
    of: str | None = None
    unit: str | None = None


@dataclass(frozen=True)
class Point:
    """One measured point: its label (engine, rate, budget ...), estimate and 95% interval (lo = hi = estimate for
    a deterministic quantity)."""

    label: str
    estimate: float
    lo: float
    hi: float
    paper: float | None = None  # exact rules: the paper's value at this point
    # serving claims: the point's measured noise floor (the reference against itself), which the effect must clear
    # to hold; (nan, nan) when it was not measured, so that the point cannot hold
    noise: tuple[float, float] | None = None


def _direction(rule: Rule, p: Point) -> str:
    if any(math.isnan(v) for v in (p.lo, p.hi)):
        return UNCLEAR
    if rule.direction == "above":
        verdict = HOLDS if p.lo > rule.threshold else FAILS if p.hi < rule.threshold else UNCLEAR
        clears = p.noise is None or p.lo > p.noise[1]  # a nan bound compares False: not cleared
    else:
        verdict = HOLDS if p.hi < rule.threshold else FAILS if p.lo > rule.threshold else UNCLEAR
        clears = p.noise is None or p.hi < p.noise[0]
    return UNCLEAR if verdict == HOLDS and not clears else verdict


def _margin(rule: Rule, p: Point) -> str:
    if any(math.isnan(v) for v in (p.lo, p.hi)):
        return UNCLEAR
    return HOLDS if p.lo >= -rule.margin else FAILS if p.hi < -rule.margin else UNCLEAR


def _exact(rule: Rule, p: Point) -> str:
    if p.paper is None or math.isnan(p.estimate):
        return UNCLEAR
    return HOLDS if abs(p.estimate - p.paper) <= rule.tolerance else FAILS


def point_verdict(rule: Rule, p: Point) -> str:
    if rule.kind == "margin":
        return _margin(rule, p)
    if rule.kind == "exact":
        return _exact(rule, p)
    return _direction(rule, p)


def decide(rule: Rule, points: list[Point]) -> str:
    """The verdict over ALL measured points: holds only if it holds at every point, does not hold if it fails at
    any point, else cannot tell. No points: cannot tell."""
    if not points:
        return UNCLEAR
    verdicts = [point_verdict(rule, p) for p in points]
    if FAILS in verdicts:
        return FAILS
    return HOLDS if all(v == HOLDS for v in verdicts) else UNCLEAR


def co_primary(accuracy: str, kl: str) -> str:
    """A claim judged on two co-primary measures (analysis/claims.yaml, power_run.heldout_kl.verdict): holds if both
    hold; does not hold if one does not hold and neither holds; the measures disagree if one holds and the other
    does not hold; otherwise (either cannot tell, or any other reading) cannot tell."""
    both = {accuracy, kl}
    if both == {HOLDS}:
        return HOLDS
    if both == {HOLDS, FAILS}:
        return DISAGREE
    if FAILS in both and both <= {FAILS, UNCLEAR}:
        return FAILS
    return UNCLEAR


def rule_text(rule: Rule) -> str:
    unit = f" {rule.unit}" if rule.unit else ""
    of = f" ({rule.of})" if rule.of else ""
    if rule.kind == "exact":
        return f"|ours - paper| <= {rule.tolerance:g}{unit} at every point"
    if rule.kind == "margin":
        return f"interval lower bound >= -{rule.margin:g}{unit}" + (" for every row" if rule.per_row else "")
    side = ">" if rule.direction == "above" else "<"
    return f"95% interval {side} {rule.threshold:g}{of} at every point"


def deciding_point(rule: Rule, points: list[Point]) -> Point | None:
    """The point that decides the verdict: the first failing one, else the first unclear one, else the one nearest
    its bound (all points are listed beside it)."""
    if not points:
        return None
    verdicts = [point_verdict(rule, p) for p in points]
    for wanted in (FAILS, UNCLEAR):
        if wanted in verdicts:
            return points[verdicts.index(wanted)]
    if rule.kind == "exact":
        return max(points, key=lambda p: abs(p.estimate - p.paper))
    if rule.kind == "margin":
        return min(points, key=lambda p: p.lo)
    return min(points, key=lambda p: p.lo - rule.threshold if rule.direction == "above" else rule.threshold - p.hi)
