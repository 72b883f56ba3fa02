"""Evaluate the policy over one run's signals: pure, no I/O.

Inputs are what the server loop read for a run (its goodput over time, the end of its last
step, its recent step time, its findings and drains); the output is the set of alerts that
should be firing now, already inhibited and fingerprinted. The alert store turns consecutive
outputs into the firing -> resolved lifecycle.
"""

from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass, field

import msgspec

from ..analysis.hangs import HangRule, live_hang
from ..lifecycle import LIVE
from ..store.findings import FindingRow
from .policy import BASELINE_S, Policy, Rule

__all__ = [
    "RESOLVE_STEPS", "Candidate", "EvaluationSignals", "RunSignals", "StoredRegression",
    "evaluate", "evaluate_evaluation", "fingerprint",
]  # fmt: skip

RESOLVE_STEPS = 100
"""A finding the analysis has not extended for this many steps of progress has cleared."""

_FP_LABELS = ("tenant", "alertname", "run_id", "node", "gpu", "rack")
# An evaluation alert is one model version's: these enter its fingerprint (only when present, so
# the fingerprints of run alerts stay what they were).
_FP_MODEL_LABELS = ("model_id", "model_version")


@dataclass(frozen=True)
class RunSignals:
    tenant: str
    run_id: str
    project: str
    now: float
    status: str  # fleetlens.lifecycle: RUNNING, HUNG, STALLED, FINISHED, FAILED, STOPPED
    last_step: int
    last_step_end: float | None
    step_time: float | None  # recent job step time (slowest rank), seconds
    goodput: list[tuple[float, float]] = field(default_factory=list)  # (time, goodput)
    findings: list[FindingRow] = field(default_factory=list)
    drains: list[tuple[float, str]] = field(default_factory=list)  # (time, node)
    stopped_at: float | None = None  # last failure, preemption, drain or finish of the run
    progress_at: float | None = None  # last progress other than a step end (a checkpoint)
    metrics: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # (time, value)
    # The run's own clock: the newest time its records carry (heartbeats too). Hangs are
    # judged against it, never against ``now``, so delivery lag is not a hang. None: ``now``.
    clock: float | None = None


@dataclass(frozen=True)
class EvaluationSignals:
    """A model version's latest judged evaluation: what it regressed against its baseline
    (each ``{kind, metric, candidate, baseline, difference, reasons, baselineVersion}``)."""

    tenant: str
    project: str
    run_id: str
    model_id: str
    model_version: str
    evaluation_id: str
    completed_at: float
    regressions: list[dict[str, object]] = field(default_factory=list)


class StoredRegression(msgspec.Struct, frozen=True, rename="camel"):
    """What an alert reads of one regression as an evaluation stores it (camelCase keys, as
    its JSON column holds them; other keys ignored)."""

    kind: object = None
    metric: object = None
    reasons: object = None
    baseline_version: object = None

    @classmethod
    def read(cls, stored: dict[str, object]) -> StoredRegression:
        return msgspec.convert(stored, cls)


@dataclass(frozen=True)
class Candidate:
    rule: Rule
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    step: int = -1
    finding_key: str = ""
    ends_at: float | None = None  # already cleared: it fired and resolved between two passes

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.labels)


def fingerprint(labels: dict[str, str]) -> str:
    keys = _FP_LABELS + tuple(k for k in _FP_MODEL_LABELS if labels.get(k))
    ident = "\x1f".join(f"{k}={labels.get(k, '')}" for k in keys)
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def _labels(rule: Rule, s: RunSignals, **extra: str) -> dict[str, str]:
    labels = {
        "alertname": rule.name,
        "severity": rule.severity,
        "audience": rule.audience,
        "tenant": s.tenant,
        "run_id": s.run_id,
        "project": s.project,
    }
    labels.update({k: v for k, v in extra.items() if v})
    return labels


def _goodput(rule: Rule, s: RunSignals) -> Candidate | None:
    if rule.threshold is None or not s.goodput or s.status not in LIVE:
        return None
    window = [(t, g) for t, g in s.goodput if t >= s.now - rule.for_s]
    older = [t for t, _ in s.goodput if t < s.now - rule.for_s]
    if not window or not older:
        return None  # the window is not covered yet: no verdict
    if any(g >= rule.threshold for _, g in window):
        return None
    below_since = window[0][0]
    for t, g in reversed(s.goodput):
        if g >= rule.threshold:
            break
        below_since = t
    latest = window[-1][1]
    return Candidate(
        rule,
        _labels(rule, s),
        {
            "summary": f"goodput {latest:.0%} under {rule.threshold:.0%} for "
            f"{(s.now - below_since) / 60:.0f} min",
            "description": rule.description,
        },
        below_since,
        s.last_step,
    )


def _hang(rule: Rule, s: RunSignals) -> Candidate | None:
    """The one hang rule (:mod:`fleetlens.analysis.hangs`) applied to the run now."""
    if s.status not in LIVE:
        return None
    if s.last_step_end is None or rule.threshold is None:
        return None
    since = max(s.last_step_end, s.progress_at or s.last_step_end)
    limit = HangRule(rule.threshold, rule.floor_s).threshold(s.step_time)
    stops = [] if s.stopped_at is None else [s.stopped_at]
    clock = s.now if s.clock is None else min(s.now, s.clock)
    if live_hang(since, clock, limit, stops) is None:
        return None  # progressing, or stopped on purpose or by a failure: recovery, not a hang
    age = clock - since
    hung = [f for f in s.findings if f.diagnosis == "hang"]
    ranks = ",".join(str(r) for r in (hung[-1].ranks if hung else [])[:16])
    return Candidate(
        rule,
        _labels(rule, s, rank=ranks),
        {
            "summary": f"no step finished for {age:.0f}s after step {s.last_step} "
            f"(recent step {s.step_time or 0:.2f}s; limit {limit:.0f}s)"
            + (f"; ranks {ranks} did not finish" if ranks else ""),
            "description": rule.description,
        },
        since + limit,
        s.last_step,
    )


def _metric(rule: Rule, s: RunSignals) -> Candidate | None:
    """A run metric against its threshold for the rule's whole window: above it (``above``), or
    by more than the threshold under (``drop``) or over (``rise``) the median of the run's own
    values in the hour before the window."""
    series = s.metrics.get(rule.metric) or []
    if rule.threshold is None or not series or s.status not in LIVE:
        return None
    start = s.now - rule.for_s
    window = [v for t, v in series if t >= start]
    before = [v for t, v in series if start - BASELINE_S <= t < start]
    if not window or not before:
        return None  # the window is not covered yet: no verdict
    thr = rule.threshold
    if rule.op == "above":
        limit, ok = thr, all(v > thr for v in window)
        said = f"{_num(window[-1])} over {_num(thr)}"
    else:
        base = statistics.median(before)
        limit = base * (1 - thr) if rule.op == "drop" else base * (1 + thr)
        ok = base > 0 and all((v < limit) if rule.op == "drop" else (v > limit) for v in window)
        change = window[-1] / base - 1 if base else 0.0
        said = f"{_num(window[-1])}, {change:+.0%} against {_num(base)} the hour before"
    if not ok:
        return None
    return Candidate(
        rule,
        _labels(rule, s, metric=rule.metric),
        {
            "summary": f"{rule.metric} {said} for {rule.for_s / 60:.0f} min",
            "description": rule.description,
            "limit": _num(limit),
        },
        start,
        s.last_step,
    )


def _num(v: float) -> str:
    return f"{v:.3g}"


def _matches(rule: Rule, f: FindingRow) -> bool:
    return f.diagnosis in rule.diagnoses and (not rule.kinds or f.kind in rule.kinds)


def _finding(rule: Rule, f: FindingRow, s: RunSignals) -> Candidate | None:
    if not _matches(rule, f):
        return None
    nodes, gpus = f.nodes, f.gpus
    node = nodes[0] if len(nodes) == 1 else ""
    gpu = str(gpus[0]).split(":")[-1] if len(gpus) == 1 else ""
    rack = f.rack or ""
    started = f.time or f.first_seen or s.now
    end = f.end_step
    ends_at = None
    if rule.severity == "page" and rule.signal == "finding":
        # A fatal fault stays until its node is drained (or someone resolves it): the job
        # recovering on other hardware does not fix the GPU. A drain already seen still
        # leaves the page on record, fired and resolved.
        cleared = [t for t, n in s.drains if t >= started and n in nodes]
        ends_at = min(cleared) if cleared else None
    elif end is not None and s.last_step - int(end) > RESOLVE_STEPS:
        return None  # the analysis stopped seeing it
    ranks = ",".join(str(r) for r in f.ranks[:16])
    return Candidate(
        rule,
        _labels(
            rule,
            s,
            node=node,
            gpu=gpu,
            rack=rack,
            rank=ranks,
            diagnosis=f.diagnosis,
            owner=f.owner,
        ),
        {
            "summary": f.summary,
            "description": rule.description,
            "finding": f.key,
        },
        float(started),
        f.step,
        f.key,
        ends_at,
    )


def evaluate(policy: Policy, s: RunSignals) -> list[Candidate]:
    """Alerts that should fire for this run now, inhibited ones removed, one per fingerprint."""
    out: dict[str, Candidate] = {}
    taken: set[int] = set()  # a finding raises one alert: the loudest rule that matches it
    order = sorted(policy.rules, key=lambda r: {"page": 0, "ticket": 1}.get(r.severity, 2))
    for rule in order:
        if rule.severity == "never":
            taken.update(i for i, f in enumerate(s.findings) if _matches(rule, f))
            continue
        found: list[Candidate | None]
        if rule.signal == "goodput":
            found = [_goodput(rule, s)]
        elif rule.signal == "hang":
            found = [_hang(rule, s)]
        elif rule.signal == "metric":
            found = [_metric(rule, s)]
        elif rule.signal == "evaluation":
            continue  # a model version's, not a run's: evaluate_evaluation
        else:
            found = []
            for i, f in enumerate(s.findings):
                if i not in taken and _matches(rule, f):
                    taken.add(i)
                    found.append(_finding(rule, f, s))
        for c in found:
            if c is not None and c.fingerprint not in out:
                out[c.fingerprint] = c
    firing = list(out.values())
    kept = []
    for c in firing:
        inhibited = any(
            i.target == c.rule.name
            and any(
                o.rule.name == i.source
                and o.ends_at is None  # a cleared cause no longer explains anything
                and all(o.labels.get(k) == c.labels.get(k) for k in i.equal)
                for o in firing
            )
            for i in policy.inhibit
        )
        if not inhibited:
            kept.append(c)
    return kept


def _reasons(r: StoredRegression) -> list[object]:
    return list(r.reasons) if isinstance(r.reasons, list) else []


def evaluate_evaluation(policy: Policy, e: EvaluationSignals) -> list[Candidate]:
    """The alerts a model version's regressions raise: one per rule whose kinds they match,
    naming every regressed metric of that kind."""
    out = []
    regressions = [StoredRegression.read(r) for r in e.regressions]
    for rule in policy.rules:
        if rule.signal != "evaluation" or rule.severity == "never":
            continue
        found = [r for r in regressions if r.kind in rule.kinds]
        if not found:
            continue
        metrics = [str("" if r.metric is None else r.metric) for r in found]
        base = next((str(r.baseline_version) for r in found if r.baseline_version), "")
        said = "; ".join(f"{r.metric}: " + ", ".join(str(x) for x in _reasons(r)) for r in found)
        labels = {
            "alertname": rule.name,
            "severity": rule.severity,
            "audience": rule.audience,
            "tenant": e.tenant,
            "run_id": e.run_id,
            "project": e.project,
            "model_id": e.model_id,
            "model_version": e.model_version,
            "evaluation_id": e.evaluation_id,
            "metric": ",".join(metrics)[:200],
        }
        if base:
            labels["baseline_version"] = base
        out.append(
            Candidate(
                rule,
                {k: v for k, v in labels.items() if v},
                {
                    "summary": f"{e.model_id}:{e.model_version} regressed against "
                    f"{base or 'its bounds'}: {said}"[:1000],
                    "description": rule.description,
                },
                e.completed_at,
            )
        )
    return out
