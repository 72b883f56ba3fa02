"""Quality gates: per-metric policies judged on examples both models answered. Pure functions.

A policy names a metric (``benchmark/metric``), whether higher or lower is better, the
regression allowed, and whether failing it blocks (hard) or warns (soft). The candidate is
compared with the baseline (the current ``production``) on the examples both were scored on:

- ``bootstrap``: the paired bootstrap interval of the mean per-example improvement; a
  regression is real when the whole interval lies below ``-maxRegression``;
- ``mcnemar``: for 0/1 outcomes, McNemar's exact test on the discordant pairs; a regression is
  real when the mean change is worse than ``-maxRegression`` and p < 1 - confidence. The
  bootstrap interval is reported as well.

Absolute bounds (``min`` / ``max`` on the candidate's mean) apply with or without a baseline.
Safety metrics are ordinary policies with ``hard: true``: they block even when quality improves.

Latency and cost (``performance/latency_p95_ms``, or just ``latency_p95_ms``; see
:mod:`.performance`) are one figure per evaluation, not per example: they take the absolute
bounds (``{"metric": "latency_p95_ms", "max": 800}``, ``cost_per_1k_examples <= Y``) and, against
the baseline, a regression is the figure worse by more than ``maxRegression`` (in its own unit).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import ValidationError

from ..errors import ConfigError
from .doc_types import CheckRecord, PolicySpec, invalid
from .metrics import mcnemar_exact, paired_bootstrap
from .performance import PERF_METRICS

PERFORMANCE = "performance"
Aggregates = dict[str, dict[str, float]]  # metric -> {mean, stderr, n}

__all__ = [
    "GateCheck",
    "GateReport",
    "Policy",
    "check_json",
    "check_of",
    "evaluate_gate",
    "parse_policies",
    "policy_specs",
]

Scores = dict[str, dict[str, dict[str, float]]]  # benchmark -> example id -> metric -> value


@dataclass(frozen=True)
class Policy:
    metric: str  # "benchmark/metric"
    direction: str = "higher"
    max_regression: float = 0.0
    hard: bool = True
    test: str = "bootstrap"
    confidence: float = 0.95
    minimum: float | None = None
    maximum: float | None = None

    @property
    def benchmark(self) -> str:
        return self.metric.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.metric.split("/", 1)[1]


def parse_policies(raw: Sequence[dict[str, Any] | PolicySpec]) -> list[Policy]:
    out = []
    for i, p in enumerate(policy_specs(raw)):
        metric = str(p.metric)
        if metric in PERF_METRICS:
            metric = f"{PERFORMANCE}/{metric}"
        if metric.startswith(PERFORMANCE + "/") and metric.split("/", 1)[1] not in PERF_METRICS:
            raise ConfigError(f"policy {i}: metric {metric!r} is unknown; use {PERF_METRICS}")
        if metric.count("/") != 1:
            raise ConfigError(f"policy {i}: metric {metric!r} must be 'benchmark/metric'")
        perf = metric.startswith(PERFORMANCE + "/")
        pol = Policy(
            metric=metric,
            direction=p.direction or ("lower" if perf else "higher"),
            max_regression=p.max_regression,
            hard=p.hard,
            test=p.test,
            confidence=p.confidence,
            minimum=p.minimum,
            maximum=p.maximum,
        )
        if pol.direction not in ("higher", "lower"):
            raise ConfigError(f"policy {metric}: direction must be 'higher' or 'lower'")
        if pol.test not in ("bootstrap", "mcnemar"):
            raise ConfigError(f"policy {metric}: test must be 'bootstrap' or 'mcnemar'")
        if not 0.5 <= pol.confidence < 1.0:
            raise ConfigError(f"policy {metric}: confidence {pol.confidence} must be in [0.5, 1)")
        out.append(pol)
    if not out:
        raise ConfigError("a gate needs at least one policy")
    return out


def policy_specs(raw: Sequence[dict[str, Any] | PolicySpec]) -> list[PolicySpec]:
    """Gate policies as the user wrote them, read (a policy's key of the wrong type refused)."""
    out = []
    for i, p in enumerate(raw):
        if isinstance(p, PolicySpec):
            out.append(p)
            continue
        try:
            out.append(PolicySpec.model_validate(p))
        except ValidationError as exc:
            raise invalid(f"policy {i}", exc) from exc
    return out


def _mean(xs: list[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else math.nan


@dataclass(frozen=True, slots=True)
class GateCheck:
    """One policy of a gate, judged: the figures compared and the verdict."""

    metric: str  # benchmark/metric
    direction: str  # higher or lower: which way is better
    hard: bool  # a failure blocks (else it warns)
    test: str  # bootstrap, mcnemar, or figure (latency and cost)
    confidence: float | None  # None for a figure
    max_regression: float
    candidate: float | None  # the candidate's mean; None: no scores
    baseline: float | None
    paired: int  # examples both were scored on
    difference: float | None  # candidate - baseline
    interval: list[float] | None  # the interval of the difference
    p_value: float | None  # McNemar's p-value (mcnemar only)
    regression: bool
    reasons: list[str]
    status: str  # pass, warn or fail


@dataclass(frozen=True, slots=True)
class GateReport:
    """A gate's verdict: passed unless a hard policy found a real regression."""

    passed: bool
    failed: list[str]  # the metrics that failed a hard policy
    warnings: list[str]  # the metrics that failed a soft policy
    checks: list[GateCheck]


def _status(pol: Policy, regression: bool) -> str:
    return ("fail" if pol.hard else "warn") if regression else "pass"


def _check(pol: Policy, cand: Scores, base: Scores | None) -> GateCheck:
    c_rows = cand.get(pol.benchmark, {})
    c_vals = [s[pol.name] for s in c_rows.values() if pol.name in s]
    candidate = _mean(c_vals) if c_vals else None
    baseline: float | None = None
    paired = 0
    difference: float | None = None
    interval: list[float] | None = None
    p_value: float | None = None
    reasons: list[str] = []
    regression = candidate is None
    if candidate is None:
        reasons.append(f"the candidate has no {pol.metric} scores")
    sign = 1.0 if pol.direction == "higher" else -1.0
    if pol.minimum is not None and candidate is not None and candidate < pol.minimum:
        regression = True
        reasons.append(f"{candidate:.4f} is below the minimum {pol.minimum}")
    if pol.maximum is not None and candidate is not None and candidate > pol.maximum:
        regression = True
        reasons.append(f"{candidate:.4f} is above the maximum {pol.maximum}")
    b_rows = (base or {}).get(pol.benchmark, {})
    shared = sorted(k for k, s in c_rows.items() if pol.name in s and pol.name in b_rows.get(k, {}))
    if base is not None and shared:
        cv = [c_rows[k][pol.name] for k in shared]
        bv = [b_rows[k][pol.name] for k in shared]
        gains = [sign * (c - b) for c, b in zip(cv, bv, strict=True)]  # > 0: candidate better
        lo, hi = paired_bootstrap(gains, pol.confidence)
        mean_gain = _mean(gains)
        diff = _mean(cv) - _mean(bv)
        baseline, paired, difference = _mean(bv), len(shared), diff
        interval = [sign * lo, sign * hi] if sign > 0 else [sign * hi, sign * lo]
        if pol.test == "mcnemar":
            if any(v not in (0.0, 1.0) for v in cv + bv):
                raise ConfigError(f"policy {pol.metric}: McNemar needs 0/1 scores; use bootstrap")
            worse = sum(g < 0 for g in gains)
            better = sum(g > 0 for g in gains)
            p = mcnemar_exact(worse, better)
            p_value = p
            real = mean_gain < -pol.max_regression and p < 1.0 - pol.confidence
            why = f"p={p:.4g} < {1 - pol.confidence:.3g}"
        else:
            real = hi < -pol.max_regression
            why = f"the {pol.confidence:.0%} interval of the change excludes the allowance"
        if real:
            regression = True
            reasons.append(
                f"regressed by {abs(diff):.4f} on {len(shared)} paired examples "
                f"(allowed {pol.max_regression}); {why}"
            )
    elif base is not None:
        reasons.append("no examples shared with the baseline: only absolute bounds apply")
    return GateCheck(
        metric=pol.metric,
        direction=pol.direction,
        hard=pol.hard,
        test=pol.test,
        confidence=pol.confidence,
        max_regression=pol.max_regression,
        candidate=candidate,
        baseline=baseline,
        paired=paired,
        difference=difference,
        interval=interval,
        p_value=p_value,
        regression=regression,
        reasons=reasons,
        status=_status(pol, regression),
    )


def _check_perf(pol: Policy, cand: Aggregates, base: Aggregates | None) -> GateCheck:
    """A latency or cost figure against its bounds and the baseline's figure."""
    c = (cand.get(pol.name) or {}).get("mean")
    b = (base or {}).get(pol.name, {}).get("mean") if base is not None else None
    reasons: list[str] = []
    regression = c is None
    if c is None:
        reasons.append(f"the candidate has no {pol.metric} (no usage, or no price)")
    else:
        if pol.minimum is not None and c < pol.minimum:
            regression = True
            reasons.append(f"{c:.4g} is below the minimum {pol.minimum}")
        if pol.maximum is not None and c > pol.maximum:
            regression = True
            reasons.append(f"{c:.4g} is above the maximum {pol.maximum}")
        if b is not None:
            worse = (c - b) if pol.direction == "lower" else (b - c)
            if worse > pol.max_regression:
                regression = True
                reasons.append(
                    f"{c:.4g} against the baseline's {b:.4g}: worse by {worse:.4g} "
                    f"(allowed {pol.max_regression})"
                )
    return GateCheck(
        metric=pol.metric,
        direction=pol.direction,
        hard=pol.hard,
        test="figure",
        confidence=None,
        max_regression=pol.max_regression,
        candidate=c,
        baseline=b,
        paired=0,
        difference=None if c is None or b is None else c - b,
        interval=None,
        p_value=None,
        regression=regression,
        reasons=reasons,
        status=_status(pol, regression),
    )


def evaluate_gate(
    policies: list[Policy],
    candidate: Scores,
    baseline: Scores | None,
    candidate_perf: Aggregates | None = None,
    baseline_perf: Aggregates | None = None,
) -> GateReport:
    """The verdict: passed unless a hard policy found a real regression."""
    checks = [
        _check_perf(p, candidate_perf or {}, baseline_perf if baseline is not None else None)
        if p.benchmark == PERFORMANCE
        else _check(p, candidate, baseline)
        for p in policies
    ]
    return GateReport(
        passed=not any(c.status == "fail" for c in checks),
        failed=[c.metric for c in checks if c.status == "fail"],
        warnings=[c.metric for c in checks if c.status == "warn"],
        checks=checks,
    )


# -- the report as the gate decision's JSON column keeps it (and reads it back) ---------------


def check_json(c: GateCheck) -> CheckRecord:
    """A check as stored in a gate decision's ``report`` column."""
    return CheckRecord.model_validate(asdict(c))


def check_of(c: CheckRecord) -> GateCheck:
    """A check read back from a gate decision's ``report`` column."""
    return GateCheck(**dict(c))
