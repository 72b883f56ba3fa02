"""The evaluation API's request bodies: camelCase JSON, validated here, handed to the evaluation
code as its typed requests (``fleetlens.evaluation.requests``).

Bodies take JSON as it is (strict: no 0 for false, no false for 0, no "1" for 1); the ones that
always ignored unknown keys still do, the others refuse them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from ..evaluation.requests import EvaluationRequest, TriggerRequest

__all__ = [
    "AliasBody",
    "CompleteBody",
    "EvaluationBody",
    "FailBody",
    "GateBody",
    "HeartbeatBody",
    "LeaseBody",
    "Scores",
    "SuiteBody",
    "TriggerBody",
]

# camelCase on the wire only (a snake_case key is not a field's name there).
STRICT = ConfigDict(strict=True, alias_generator=to_camel)
STRICT_CLOSED = ConfigDict(strict=True, alias_generator=to_camel, extra="forbid")


class EvaluationBody(BaseModel):
    model_config = STRICT

    model_id: str = ""
    model_version: str = ""
    run_id: str = ""
    checkpoint_id: str = ""
    model_hash: str = Field("", description="content hash of the weights, when no checkpoint")
    adapter: dict[str, Any] | None = Field(
        None, description="{kind: callable|openai|hf, ...}; default: the suite's"
    )
    suite: dict[str, Any] | None = Field(None, description="{name, version, benchmarks: [...]}")
    benchmark_suite: str = Field("", description="a registered suite: name or name@version")
    decoding: dict[str, Any] = Field(default_factory=dict)
    priority: str = Field("P2", description="P0 safety .. P3 exploratory")
    deadline: float | None = Field(None, ge=0, le=1e12, allow_inf_nan=False)
    shard_size: int = Field(50, ge=1, le=100_000)
    max_attempts: int = Field(3, ge=1, le=20)
    code_commit: str = ""
    no_cache: bool = False

    def request(self) -> EvaluationRequest:
        return EvaluationRequest(
            adapter=self.adapter,
            suite=self.suite,
            benchmark_suite=self.benchmark_suite,
            model_id=self.model_id,
            model_version=self.model_version,
            run_id=self.run_id,
            checkpoint_id=self.checkpoint_id,
            model_hash=self.model_hash,
            decoding=self.decoding,
            priority=self.priority,
            deadline=self.deadline,
            shard_size=self.shard_size,
            max_attempts=self.max_attempts,
            code_commit=self.code_commit,
            no_cache=self.no_cache,
        )


class SuiteBody(BaseModel):
    model_config = STRICT_CLOSED

    name: str = Field(min_length=1, max_length=128)
    version: str = Field(min_length=1, max_length=128)
    description: str = ""
    benchmarks: list[dict[str, Any]] = Field(min_length=1)
    gates: list[dict[str, Any]] | None = Field(None, description="gate policies, as POST /v1/gates")
    decoding: dict[str, Any] | None = None
    adapter: dict[str, Any] | None = Field(None, description="the default adapter (a template)")
    prices: dict[str, dict[str, float]] | None = Field(
        None, description="model or endpoint (or *) -> {inputPer1kTokens, outputPer1kTokens}"
    )

    def spec(self) -> dict[str, Any]:
        """The suite's spec, the JSON document the suite registry keeps (the fields sent)."""
        return self.model_dump(exclude_none=True)


class TriggerBody(BaseModel):
    model_config = STRICT_CLOSED

    on: str = Field(description="model (a version registered), checkpoint (verified), alias")
    suite: str = Field(min_length=1, description="a registered suite: name or name@version")
    project: str = Field("", description="empty: every project")
    model_id: str = Field("", description="empty: any model")
    alias: str = ""
    adapter: dict[str, Any] | None = Field(
        None, description="template: {checkpointUri}, {runId}, {modelId}, {modelVersion}"
    )
    priority: str = Field("P1", pattern="^P[0-3]$")

    def request(self) -> TriggerRequest:
        return TriggerRequest(
            on=self.on,
            suite=self.suite,
            project=self.project,
            model_id=self.model_id,
            alias=self.alias,
            adapter=self.adapter,
            priority=self.priority,
        )


# One example's scores: numbers by metric, and notes beside them (a judge's ``judge_rationale``).
Scores = dict[str, dict[str, float | Annotated[str, Field(max_length=16_384)]]]


class LeaseBody(BaseModel):
    model_config = STRICT

    worker_id: str = Field(min_length=1, max_length=256)
    prefer_locality: str = ""
    lease_s: float = Field(30.0, gt=0, le=3600)


class HeartbeatBody(BaseModel):
    model_config = STRICT

    lease_token: str
    lease_s: float = Field(30.0, gt=0, le=3600)
    partial: Scores | None = None


class CompleteBody(BaseModel):
    model_config = STRICT

    lease_token: str
    scores: Scores


class FailBody(BaseModel):
    model_config = STRICT

    lease_token: str
    error: str = ""


class GateBody(BaseModel):
    model_config = STRICT

    model_id: str = Field(min_length=1)
    version: str = Field(min_length=1)
    policies: list[dict[str, Any]] = Field(
        description="[{metric: 'bench/metric', direction, maxRegression, hard, test, confidence}]"
    )
    candidate_evaluation: str = ""
    baseline_alias: str = "production"
    baseline_evaluation: str = ""


class AliasBody(BaseModel):
    model_config = STRICT

    version: str = Field(min_length=1)
    decision_id: str = ""
    override_reason: str = Field("", description="admin only: move a guarded alias without a gate")
