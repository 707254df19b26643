"""The claims registry (``analysis/claims.yaml``): the paper's headline claims with the rule that decides each,
written before the runs that decide them. ``load_registry`` reads and checks it; ``decide`` applies a rule to the
estimates of every measured point.

A rule never looks at a subset of the points: ``decide`` takes all of them and returns the worst of their
verdicts, so the verdict over all points is never better than over any subset — no choice of points can make a
claim look better than the full set does (``tests/test_claims.py`` checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REGISTRY = Path(__file__).parent / "claims.yaml"
HOLDS, FAILS, UNCLEAR = "holds", "does not hold", "cannot tell"
KINDS = ("direction", "margin", "exact", "every_point")
REQUIRED = ("id", "statement", "paper", "artefact", "estimator", "rule", "over", "registered", "decided_by")


class RegistryError(ValueError):
    """The registry file is malformed (one line: which claim, what is wrong)."""


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
class RegisteredClaim:
    id: str
    statement: str
    paper: dict
    artefact: str
    estimator: str
    rule: Rule
    over: str
    registered: str
    decided_by: str
    noise: str | None = None
    extra: dict = field(default_factory=dict)


def load_registry(path: str | Path = REGISTRY) -> list[RegisteredClaim]:
    """Every claim of the registry, checked: required fields, a known rule kind, unique ids."""
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("claims"), list):
        raise RegistryError(f"{path}: expected a mapping with a 'claims' list")
    out, seen = [], set()
    for entry in data["claims"]:
        cid = entry.get("id", "?") if isinstance(entry, dict) else "?"
        missing = [k for k in REQUIRED if not isinstance(entry, dict) or k not in entry]
        if missing:
            raise RegistryError(f"{path}: claim {cid} lacks {', '.join(missing)}")
        if cid in seen:
            raise RegistryError(f"{path}: claim id {cid} appears twice")
        seen.add(cid)
        rule = dict(entry["rule"])
        if rule.get("kind") not in KINDS:
            raise RegistryError(f"{path}: claim {cid}: rule kind {rule.get('kind')!r} is not one of {', '.join(KINDS)}")
        unknown = set(rule) - set(Rule.__dataclass_fields__)
        if unknown:
            raise RegistryError(f"{path}: claim {cid}: unknown rule field(s) {', '.join(sorted(unknown))}")
        if rule.get("direction", "above") not in ("above", "below"):
            raise RegistryError(f"{path}: claim {cid}: direction must be 'above' or 'below'")
        known = {k: entry[k] for k in RegisteredClaim.__dataclass_fields__ if k in entry and k not in ("rule", "extra")}
        extra = {k: v for k, v in entry.items() if k not in RegisteredClaim.__dataclass_fields__}
        out.append(RegisteredClaim(**{**known, "registered": str(entry["registered"])}, rule=Rule(**rule),
                                   extra=extra))
    return out


@dataclass(frozen=True)
class Point:
    """One measured point: its label (engine, rate, budget ...), estimate and 95% interval (lo = hi = estimate for
    a deterministic quantity)."""

    label: str
    estimate: float
    lo: float
    hi: float
    paper: float | None = None  # exact rules: the paper's value at this point


def _direction(rule: Rule, p: Point) -> str:
    if any(math.isnan(v) for v in (p.lo, p.hi)):
        return UNCLEAR
    if rule.direction == "above":
        return HOLDS if p.lo > rule.threshold else FAILS if p.hi < rule.threshold else UNCLEAR
    return HOLDS if p.hi < rule.threshold else FAILS if p.lo > rule.threshold else UNCLEAR


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
