"""What an evaluation regressed against its baseline, by kind: pure functions.

When an evaluation of a model version completes, it is judged against the evaluation of the
version the model's ``production`` alias points at, with its suite's gates (or, without gates,
every metric both evaluations share, tested as gates test them, and the latency p95 allowed 20%
worse). Each check that fails (or warns) is a regression of one kind, which the alert policy
turns into an alert (seed 001 s36): ``safety`` (an ``unsafe_rate``, or a gate marked
``"kind": "safety"``) pages; ``benchmark``, ``latency`` and ``cost`` ticket.
"""

from __future__ import annotations

from typing import Any

from .doc_types import PolicySpec, RegressionRecord
from .gates import PERFORMANCE, Scores, evaluate_gate, parse_policies, policy_specs

__all__ = ["KINDS", "default_policies", "find_regressions", "kind_of"]

KINDS = ("safety", "benchmark", "latency", "cost")
_LOWER = ("unsafe_rate", "perplexity")
LATENCY_ALLOWANCE = 0.2  # without gates: p95 latency may be 20% worse than the baseline's


def kind_of(metric: str, declared: str = "") -> str:
    if declared in KINDS:
        return declared
    bench, _, name = metric.partition("/")
    if name == "unsafe_rate" or "safety" in bench:
        return "safety"
    if bench == PERFORMANCE:
        return "cost" if name.startswith("cost") else "latency"
    return "benchmark"


def default_policies(
    cand_metrics: dict[str, Any], base_metrics: dict[str, Any]
) -> list[PolicySpec]:
    """Every metric both evaluations have, in the direction that is better for it."""
    out: list[PolicySpec] = []
    for bench, ms in cand_metrics.items():
        for name in ms:
            if name not in (base_metrics.get(bench) or {}):
                continue
            if bench == PERFORMANCE:
                if name == "latency_p95_ms":
                    base = float(base_metrics[bench][name]["mean"])
                    out.append(
                        PolicySpec(
                            metric=f"{bench}/{name}",
                            direction="lower",
                            max_regression=base * LATENCY_ALLOWANCE,
                        )
                    )
                continue
            if name == "perplexity":
                continue  # one figure over all tokens, not per example
            out.append(
                PolicySpec(
                    metric=f"{bench}/{name}",
                    test="bootstrap",
                    direction="lower" if name in _LOWER else "higher",
                )
            )
    return out


def find_regressions(
    gates: list[dict[str, Any]] | None,
    cand_scores: Scores,
    cand_metrics: dict[str, Any],
    base_scores: Scores | None,
    base_metrics: dict[str, Any] | None,
) -> list[RegressionRecord] | None:
    """The failing checks, each with its kind; None when there is nothing to judge by."""
    raw = policy_specs(gates or [])
    if not raw and base_metrics is not None:
        raw = default_policies(cand_metrics, base_metrics)
    if not raw:
        return None
    declared = {str(p.metric).rpartition("/")[2]: p.kind for p in raw}
    report = evaluate_gate(
        parse_policies(raw),
        cand_scores,
        base_scores,
        cand_metrics.get(PERFORMANCE) or {},
        (base_metrics or {}).get(PERFORMANCE) if base_metrics is not None else None,
    )
    out = []
    for c in report.checks:
        if c.status == "pass":
            continue
        name = c.metric.rpartition("/")[2]
        out.append(
            RegressionRecord(
                kind=kind_of(c.metric, declared.get(name, "")),
                metric=c.metric,
                candidate=c.candidate,
                baseline=c.baseline,
                difference=c.difference,
                status=c.status,
                reasons=list(c.reasons),
            )
        )
    return out
