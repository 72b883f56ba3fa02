"""The JSON the evaluation API answers about quality gates and model aliases (promotion), as
pydantic models; the keys are the ones :mod:`fleetlens.evaluation.registry` and
:mod:`fleetlens.evaluation.gates` build."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .models import ApiModel

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
