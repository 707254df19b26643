"""The claims registry (``analysis/claims.yaml``): the paper's headline claims with the rule that decides each,
written before the runs that decide them. ``load_registry`` reads and checks it; ``decide`` applies a rule to the
estimates of every measured point.

How a rule judges its points: ``analysis.rules``; what the points of each claim are: ``analysis.evidence``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from analysis.evidence import Evidence, NoEvidence, evaluators, kl_evaluators
from analysis.rules import (FAILS, HOLDS, KINDS, Point, Rule, co_primary, decide, deciding_point, point_verdict,
                            rule_text)

REGISTRY = Path(__file__).parent / "claims.yaml"
REQUIRED = ("id", "statement", "paper", "artefact", "estimator", "rule", "over", "registered", "registered_commit",
            "data_seen", "points", "decided_by")
AMENDMENT_FIELDS = ("date", "commit", "what", "why", "outcome_visible")


class RegistryError(ValueError):
    """The registry file is malformed (one line: which claim, what is wrong)."""


@dataclass(frozen=True)
class Amendment:
    """A change to a registered claim after it was written: when, in which commit, what and why, and whether the
    outcome it could change was visible then (``yes``, ``no`` or ``partly``, each with its reason)."""

    date: str
    commit: str
    what: str
    why: str
    outcome_visible: str

    @property
    def visible(self) -> bool:
        return not self.outcome_visible.startswith("no")


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
    registered_commit: str
    data_seen: str
    points: tuple[str, ...]
    decided_by: str
    amendments: tuple[Amendment, ...] = ()
    noise: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def written_before_data(self) -> bool:
        """Whether nothing this claim is judged on had been measured when its rule was written."""
        return self.data_seen.startswith("none")


def _amendments(path, cid: str, entries) -> tuple[Amendment, ...]:
    if entries is None:
        return ()
    if not isinstance(entries, list) or not all(isinstance(a, dict) for a in entries):
        raise RegistryError(f"{path}: claim {cid}: amendments must be a list of mappings")
    out = []
    for a in entries:
        missing = [k for k in AMENDMENT_FIELDS if not str(a.get(k, "")).strip()]
        if missing or set(a) - set(AMENDMENT_FIELDS):
            raise RegistryError(f"{path}: claim {cid}: an amendment needs exactly {', '.join(AMENDMENT_FIELDS)}"
                                + (f" (lacks {', '.join(missing)})" if missing else ""))
        if not str(a["outcome_visible"]).startswith(("yes", "no", "partly")):
            raise RegistryError(f"{path}: claim {cid}: outcome_visible must start with yes, no or partly")
        out.append(Amendment(**{k: str(a[k]) for k in AMENDMENT_FIELDS}))
    return tuple(sorted(out, key=lambda a: a.date))


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
        points = entry["points"]
        if not isinstance(points, list) or not points or not all(isinstance(p, str) and p for p in points):
            raise RegistryError(f"{path}: claim {cid}: points must be a non-empty list of point names")
        special = ("rule", "extra", "points", "amendments")
        known = {k: entry[k] for k in RegisteredClaim.__dataclass_fields__ if k in entry and k not in special}
        extra = {k: v for k, v in entry.items() if k not in RegisteredClaim.__dataclass_fields__}
        out.append(RegisteredClaim(**{**known, "registered": str(entry["registered"]),
                                      "registered_commit": str(entry["registered_commit"])},
                                   rule=Rule(**rule), points=tuple(points),
                                   amendments=_amendments(path, cid, entry.get("amendments")), extra=extra))
    return out


# A claim's status: awaiting (no point yet), provisional (points from single runs; a later run decides it), decided.
AWAITING, PROVISIONAL, DECIDED = "awaiting", "provisional", "decided"


DEPENDS = "depends on budget"


@dataclass(frozen=True)
class Scaling:
    """What the budget-scaling study says of a claim (analysis/claims.yaml, budget_scaling): the per-budget KL
    verdicts, their ordering, and the claim's accuracy rule at the end points (smallest first)."""

    kl: str = ""
    ordering: str = ""
    accuracy: list[tuple[int, str]] = field(default_factory=list)

    def text(self) -> str:
        return "; ".join(f"{b} tokens: {v}" for b, v in self.accuracy)


def _scaling(reports: Path) -> dict[str, Scaling]:
    """Per claim, the registered reading of reports/budget_scaling.csv (empty without the study)."""
    import pandas as pd

    path = reports / "budget_scaling.csv"
    if not path.is_file():
        return {}
    df = pd.read_csv(path)
    out = {}
    for claim, g in df[df.claim.notna()].groupby("claim", sort=False):
        kl = g[(g.kind == "pair") & (g.metric == "kl_difference")].sort_values("budget")
        acc = g[(g.kind == "pair") & (g.metric == "accuracy_difference")].sort_values("budget")
        order = g[g.kind == "ordering"]
        out[claim] = Scaling(
            kl="; ".join(f"{int(r.budget)}: {_fmt(r.estimate)} [{_fmt(r.lo)}, {_fmt(r.hi)}] {r.verdict}"
                         for r in kl.itertuples()),
            ordering=order.verdict.iloc[0] if len(order) else "",
            accuracy=[(int(r.budget), f"{_fmt(r.estimate)} [{_fmt(r.lo)}, {_fmt(r.hi)}] {r.verdict}")
                      for r in acc.itertuples()],
        )
    return out


def budget_verdict(table_verdict: str, largest_accuracy: str | None) -> str:
    """The registered rule: the table budget's verdict stands unless the claim's accuracy rule at the largest budget
    decides the opposite (then "depends on budget")."""
    if largest_accuracy is None:
        return table_verdict
    opposite = {HOLDS: FAILS, FAILS: HOLDS}.get(table_verdict)
    return DEPENDS if opposite is not None and largest_accuracy.endswith(opposite) else table_verdict


def _fmt(v: float) -> str:
    return "nan" if math.isnan(v) else f"{v:.4g}"


def evidence_commit(path: str | Path, commits: dict[str, str], default: str) -> str:
    """The commit(s) that computed one evidence file: ``commits`` by file name where given (``seeds.csv``); else what
    its raw folder records (``analysis.raw_summary.computed_at``: each file's own commit where recorded, else the
    folder's ``collected_at``; several joined by commas) — the folder itself for a manifest, or the raw folder a table is
    rendered from (``analysis.raw.TABLE_RAW``); else ``default``."""
    from analysis.raw import MANIFEST, TABLE_RAW
    from analysis.raw_summary import computed_at

    path = Path(path)
    if path.name in commits:
        return commits[path.name]
    folder = path.parent if path.name == MANIFEST else path.parent / "raw" / TABLE_RAW.get(path.stem, "-")
    if (folder / MANIFEST).is_file():
        return ",".join(computed_at(folder)) or default
    return default


def matches(name: str, label: str) -> bool:
    """Whether a measured point's label is the registered point ``name`` (the label may add how it was measured:
    "(3 seeds)", ": 29 vs 96 MiB (5 repeats)")."""
    return label == name or label.startswith((name + " ", name + ":"))


def with_registered_points(claim: RegisteredClaim, points: list[Point]) -> tuple[list[Point], list[str]]:
    """``points`` plus one "not measured" point (no estimate, so it can never hold) for every registered point the
    evaluator did not return, and the names of those: no registered point is ever left out of a verdict."""
    missing = [name for name in claim.points if not any(matches(name, p.label) for p in points)]
    return points + [Point(f"{name} (not measured)", math.nan, math.nan, math.nan) for name in missing], missing


def amendments_text(claim: RegisteredClaim) -> str:
    return " | ".join(f"{a.date} ({a.commit}): {a.what}; why: {a.why}; outcome visible: {a.outcome_visible}"
                      for a in claim.amendments)


def _points_text(rule, points: list[Point]) -> str:
    return "; ".join(f"{p.label}: {_fmt(p.estimate)} [{_fmt(p.lo)}, {_fmt(p.hi)}]"
                     + (f" (paper {_fmt(p.paper)})" if p.paper is not None else "")
                     + (f" noise [{_fmt(p.noise[0])}, {_fmt(p.noise[1])}]" if p.noise else "")
                     + f" {point_verdict(rule, p)}" for p in points)


def _kl_reading(claim: RegisteredClaim, reports: Path, registered_points: bool) -> dict:
    """A claim's co-primary held-out KL verdict (analysis/claims.yaml, power_run.heldout_kl): its own rule on the KL
    quality difference at every registered point (one not measured keeps it from holding), whether those points
    decide (every row with its registered seeds), and why not."""
    try:
        ev = kl_evaluators()[claim.id](reports)
    except NoEvidence as none:
        ev = Evidence([], [none.path], none.why)
    points, missing = with_registered_points(claim, ev.points) if registered_points else (ev.points, [])
    decider = deciding_point(claim.rule, points)
    why = ev.missing or ev.short or (f"registered point(s) not measured: {', '.join(missing)}" if missing else "")
    return {"verdict": decide(claim.rule, points), "decided": bool(ev.points) and ev.seeded and not missing,
            "why": why, "points": _points_text(claim.rule, points),
            "estimate": decider.estimate if decider else math.nan, "lo": decider.lo if decider else math.nan,
            "hi": decider.hi if decider else math.nan, "deciding": decider.label if decider else ""}


def _judged(claim: RegisteredClaim, reports: Path, registered_points: bool):
    """A claim's accuracy evidence under a reports root: (evidence, every point with the registered ones not measured
    added, those missing, the deciding point)."""
    try:
        ev = evaluators()[claim.id](reports)
    except NoEvidence as none:
        ev = Evidence([], [none.path], none.why)
    points, missing = with_registered_points(claim, ev.points) if registered_points and ev.points \
        else (ev.points, [])
    return ev, points, missing, deciding_point(claim.rule, points)


def evaluate(reports: str | Path, registry: str | Path = REGISTRY, commit: str = "",
             commits: dict[str, str] | None = None, registered_points: bool = True):
    """One row per registered claim: its rule, every point, the deciding point, the verdict over all points and
    its status (decided / provisional / awaiting). ``registered_points``: judge every point the registry names (the
    default profile's), a missing one as "not measured" (another profile measures other points: False judges the
    points it has). ``commit``: the commit that computed the evidence; ``commits``:
    per evidence file name (``seeds.csv``), where files come from different runs; a raw folder's manifest names its
    own (``evidence_commit``). Returns a DataFrame in the
    registry's order; ``evidence_commit`` lists one commit per evidence file."""
    import pandas as pd

    reports, commits = Path(reports), commits or {}
    scaling = _scaling(reports)
    from analysis.extended import extended_judged, extended_reading

    second = set(extended_judged(registry))
    rows, rows_extended = [], {}
    for claim in load_registry(registry):
        if claim.id not in evaluators():
            raise RegistryError(f"{registry}: claim {claim.id} has no evaluator in analysis/evidence.py")
        ev, points, missing, decider = _judged(claim, reports, registered_points)
        verdict = decide(claim.rule, points)
        by_current_run = claim.decided_by.startswith("default profile")
        by_scaling = "budget-scaling" in claim.decided_by
        study = scaling.get(claim.id)
        scaling_pending = by_scaling and study is None
        powered = ev.seeded or ev.powered  # the points carry every source of variance the estimator names
        status = (AWAITING if not ev.points else DECIDED if (by_current_run or (powered and not scaling_pending))
                  and not missing else PROVISIONAL)
        if by_scaling and study is not None and study.accuracy and ev.points:
            verdict = budget_verdict(verdict, study.accuracy[-1][1])
        kl = _kl_reading(claim, reports, registered_points) if claim.id in kl_evaluators() else None
        verdict_accuracy = verdict
        if kl is not None and ev.points:  # an awaiting claim stays "cannot tell" whatever the KL says
            verdict = co_primary(verdict_accuracy, kl["verdict"])
            if status == DECIDED and not kl["decided"]:
                status = PROVISIONAL
        if status == PROVISIONAL and missing:
            why = f"registered point(s) not measured: {', '.join(missing)}"
        elif status == PROVISIONAL and ev.seeded:
            why = ("decided at the table budget by the seeds run (seeds.csv); "
                   + ("reports/budget_scaling.csv has no row of this comparison" if (reports / "budget_scaling.csv")
                      .is_file() else "the ordering across budgets awaits the budget-scaling study"))
        elif status == PROVISIONAL and ev.short:
            why = f"decided by {claim.decided_by}; {ev.short}"
        elif status == PROVISIONAL and ev.missing:
            why = f"decided by {claim.decided_by}; these points are seeded, but {ev.missing} yet"
        elif status == PROVISIONAL:
            why = f"decided by {claim.decided_by}; these points are from single training runs or single serving runs"
        elif ev.note:
            why = ev.note
        else:
            why = ev.missing if status == AWAITING else ""
        if kl is not None and status == PROVISIONAL and not kl["decided"]:
            why = "; ".join(x for x in (why, f"held-out KL (co-primary): {kl['why']}") if x)
        extended = extended_reading(claim, reports, registered_points) if claim.id in second else None
        if extended is not None:  # the study's columns exist only where it has run (the committed page predates it)
            rows_extended[claim.id] = extended
        rows.append({
            "id": claim.id,
            "statement": claim.statement,
            "rule": rule_text(claim.rule),
            "estimate": decider.estimate if decider else math.nan,
            "lo": decider.lo if decider else math.nan,
            "hi": decider.hi if decider else math.nan,
            "deciding_point": decider.label if decider else "",
            "points": _points_text(claim.rule, points),
            "n_points": len(points),
            "missing_points": "; ".join(missing),
            "verdict": verdict,
            "status": status,
            "why": why,
            "evidence": " ".join(ev.files + ([str(reports / "budget_scaling.csv")] if study else [])),
            "evidence_commit": " ".join(evidence_commit(f, commits, commit) for f in ev.files
                                        + ([str(reports / "budget_scaling.csv")] if study else [])) or commit,
            "registered": claim.registered,
            "registered_commit": claim.registered_commit,
            "data_seen": claim.data_seen,
            "n_amendments": len(claim.amendments),
            "amendments_outcome_visible": sum(a.visible for a in claim.amendments),
            "amendments": amendments_text(claim),
            "decided_by": claim.decided_by,
            "scaling_kl": study.kl if study else "",
            "scaling_ordering": study.ordering if study else "",
            "scaling_accuracy": study.text() if study else "",
            "verdict_accuracy": verdict_accuracy if kl is not None else "",
            "verdict_kl": kl["verdict"] if kl is not None else "",
            "kl_estimate": kl["estimate"] if kl is not None else math.nan,
            "kl_lo": kl["lo"] if kl is not None else math.nan,
            "kl_hi": kl["hi"] if kl is not None else math.nan,
            "kl_deciding_point": kl["deciding"] if kl is not None else "",
            "kl_points": kl["points"] if kl is not None else "",
        })
    frame = pd.DataFrame(rows)
    if rows_extended:
        for key in ("verdict", "status", "estimate", "lo", "hi", "points"):
            frame[f"extended_{key}"] = [rows_extended.get(cid, {}).get(key, math.nan if key in ("estimate", "lo", "hi")
                                                                      else "") for cid in frame.id]
    return frame


def counts_text(frame, what: str = "registered claims") -> str:
    """The claims of reports/claims.csv counted by status and verdict, with their ids (failing ones first)."""
    order = [(DECIDED, FAILS), (PROVISIONAL, FAILS), (DECIDED, HOLDS), (PROVISIONAL, HOLDS)]
    groups = {key: list(g.id) for key, g in frame.groupby(["status", "verdict"], sort=False)}
    keys = order + [k for k in groups if k not in order]
    parts = [f"{len(groups[k])} {k[0]}{'' if k[0] == AWAITING else ' and ' + k[1]} ({', '.join(groups[k])})"
             for k in keys if k in groups]
    return f"{len(frame)} {what}: " + "; ".join(parts) + "."


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m analysis.claims",
                                     description="Apply the registered rules (analysis/claims.yaml) to the "
                                     "artefacts in REPORTS and write one row per claim (reports/claims.csv).")
    parser.add_argument("reports", help="the reports/ folder whose tables are the evidence")
    parser.add_argument("--output", "-o", required=True, help="CSV to write")
    parser.add_argument("--registry", default=str(REGISTRY), help="the claims registry (default: %(default)s)")
    parser.add_argument("--evidence-commit", default=None,
                        help="the commit that computed the tables in REPORTS (default: this checkout's HEAD, as in a "
                        "pipeline run; for tables committed earlier, the commit in their provenance.json)")
    parser.add_argument("--measured-points-only", action="store_true",
                        help="judge the points the reports hold, not the registry's named points (the registry names "
                        "the default profile's points; other profiles measure others)")
    parser.add_argument("--commit-of", action="append", default=[], metavar="FILE=COMMIT",
                        help="the commit that computed one evidence file (e.g. seeds.csv=abc123), where the tables "
                        "come from different runs; repeatable")
    args = parser.parse_args(argv)
    bad = [x for x in args.commit_of if x.count("=") != 1 or not all(x.split("="))]
    if bad:
        parser.exit(2, f"error: --commit-of {bad[0]!r}: expected FILE=COMMIT, e.g. seeds.csv=abc123\n")
    from analysis.io import write_csv
    from swiftkv.provenance import git_commit

    try:
        frame = evaluate(args.reports, args.registry, commit=args.evidence_commit or git_commit(),
                         commits=dict(x.split("=") for x in args.commit_of),
                         registered_points=not args.measured_points_only)
    except RegistryError as err:
        parser.exit(2, f"error: {err}\n")
    write_csv(frame, args.output)
    counts = frame.groupby(["status", "verdict"]).size()
    print("; ".join(f"{s}, {v}: {n}" for (s, v), n in counts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
