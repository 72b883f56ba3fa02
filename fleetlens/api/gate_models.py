"""The JSON the evaluation API answers about quality gates and model aliases (promotion), as
pydantic models, each built by its ``of`` from the typed value
:mod:`fleetlens.evaluation.registry` or :mod:`fleetlens.evaluation.gates` returns."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import Field

from .models import ApiModel

if TYPE_CHECKING:
    from ..evaluation.gates import GateCheck
    from ..evaluation.registry import AliasMoveView, AliasSet, GateDecisionView

__all__ = [
    "AliasMoveOut",
    "AliasSetOut",
    "AliasesOut",
    "GateCheckOut",
    "GateDecisionListOut",
    "GateDecisionOut",
    "TriggeredOut",
]


class GateCheckOut(ApiModel):
    """One policy of a gate, judged: the figures compared and the verdict."""

    metric: str = Field(description="benchmark/metric")
    direction: Literal["higher", "lower"] = Field(description="which way is better")
    hard: bool = Field(description="a failure blocks (else it warns)")
    test: str = Field(description="bootstrap, mcnemar, or figure (latency and cost)")
    confidence: float | None = Field(description="null for a figure")
    max_regression: float
    candidate: float | None = Field(description="the candidate's mean; null: no scores")
    baseline: float | None
    paired: int = Field(description="examples both were scored on")
    difference: float | None = Field(description="candidate - baseline")
    interval: list[float] | None = Field(description="the interval of the difference")
    p_value: float | None = Field(description="McNemar's p-value (mcnemar only)")
    regression: bool
    reasons: list[str]
    status: Literal["pass", "warn", "fail"]

    @classmethod
    def of(cls, c: GateCheck) -> GateCheckOut:
        return cls(
            metric=c.metric,
            direction=cast(Literal["higher", "lower"], c.direction),  # pydantic checks them
            hard=c.hard,
            test=c.test,
            confidence=c.confidence,
            max_regression=c.max_regression,
            candidate=c.candidate,
            baseline=c.baseline,
            paired=c.paired,
            difference=c.difference,
            interval=c.interval,
            p_value=c.p_value,
            regression=c.regression,
            reasons=list(c.reasons),
            status=cast(Literal["pass", "warn", "fail"], c.status),
        )


class GateDecisionOut(ApiModel):
    """A gate decision: the candidate judged against the baseline, policy by policy."""

    decision_id: str
    model_id: str
    version: str = Field(description="the candidate version")
    actor: str = Field("", description="who ran it (a stored decision only)")
    created_at: float = Field(0.0, description="when it ran (a stored decision only)")
    passed: bool
    failed: list[str] = Field(description="the metrics that failed a hard policy")
    warnings: list[str] = Field(description="the metrics that failed a soft policy")
    checks: list[GateCheckOut]
    baseline_alias: str
    baseline_version: str | None
    baseline_evaluation: str | None
    candidate_evaluation: str

    @classmethod
    def of(cls, d: GateDecisionView) -> GateDecisionOut:
        """``actor`` and ``createdAt`` only for a stored decision read back."""
        opt: dict[str, Any] = {}
        if d.actor is not None:
            opt["actor"] = d.actor
        if d.created_at is not None:
            opt["created_at"] = d.created_at
        return cls(
            decision_id=d.decision_id,
            model_id=d.model_id,
            version=d.version,
            passed=d.report.passed,
            failed=list(d.report.failed),
            warnings=list(d.report.warnings),
            checks=[GateCheckOut.of(c) for c in d.report.checks],
            baseline_alias=d.baseline_alias,
            baseline_version=d.baseline_version,
            baseline_evaluation=d.baseline_evaluation,
            candidate_evaluation=d.candidate_evaluation,
            **opt,
        )


class GateDecisionListOut(ApiModel):
    """A model's gate decisions, newest first."""

    model_id: str
    decisions: list[GateDecisionOut]


class AliasMoveOut(ApiModel):
    """One move of an alias."""

    alias: str
    from_: str | None = Field(alias="from", description="the version before; null: new alias")
    to: str
    decision_id: str | None = Field(description="the gate decision behind it")
    override: bool = Field(description="an admin moved it without a passing gate")
    reason: str
    actor: str
    at: float

    @classmethod
    def of(cls, m: AliasMoveView) -> AliasMoveOut:
        before: dict[str, Any] = {"from": m.from_version}  # a Python keyword: field ``from_``
        return cls(
            alias=m.alias,
            to=m.to_version,
            decision_id=m.decision_id,
            override=m.override,
            reason=m.reason,
            actor=m.actor,
            at=m.at,
            **before,
        )


class AliasesOut(ApiModel):
    """A model's aliases and every move of them, oldest first."""

    model_id: str
    aliases: dict[str, str] = Field(description="alias -> version")
    history: list[AliasMoveOut]


class TriggeredOut(ApiModel):
    """The evaluations an alias move started, and the triggers that could not start one."""

    evaluations: list[str]
    errors: list[str]


class AliasSetOut(ApiModel):
    """An alias moved."""

    model_id: str
    alias: str
    version: str
    from_: str | None = Field(alias="from", description="the version before; null: new alias")
    override: bool
    decision_id: str | None
    triggered: TriggeredOut

    @classmethod
    def of(cls, v: AliasSet, triggered: dict[str, list[str]]) -> AliasSetOut:
        """The move, and what the triggers on it started (``EvalStore.fire``)."""
        before: dict[str, Any] = {"from": v.from_version}  # a Python keyword: field ``from_``
        return cls(
            model_id=v.model_id,
            alias=v.alias,
            version=v.version,
            override=v.override,
            decision_id=v.decision_id,
            triggered=TriggeredOut(
                evaluations=list(triggered["evaluations"]), errors=list(triggered["errors"])
            ),
            **before,
        )
