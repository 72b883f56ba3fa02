"""The JSON of a run comparison (``GET /v1/runs/compare``, :mod:`fleetlens.api.graph`): config
diff, each run's figures side by side, loss at matched steps, evaluations, contracts and a
conclusion per run against the baseline. Built from
:class:`fleetlens.services.compare_types.Comparison`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import Field

from ..services.compare_types import Comparison
from .models import ApiModel

__all__ = [
    "ChangedValuesOut",
    "CompareOut",
    "ConclusionOut",
    "ConfigDiffOut",
    "RegressionOut",
]


# ---- comparison ---------------------------------------------------------------------------
class ConfigDiffOut(ApiModel):
    """A flattened config key whose values differ between the runs."""

    key: str
    status: Literal["changed", "added", "removed"]
    values: list[Any] = Field(description="in run order; null where absent")


class ChangedValuesOut(ApiModel):
    values: list[str | None] = Field(description="in run order")
    changed: bool


class RunHealthOut(ApiModel):
    """A run's fault and lifecycle events, and the nodes and GPUs it used."""

    faults: dict[str, int] = Field(description="events by kind")
    fault_nodes: list[str]
    nodes: int
    gpus: int
    issues: list[str] = Field(description="the infrastructure issues the conclusion reads")


class CompareSideOut(ApiModel):
    """One run's figures side by side with the others'."""

    run_id: str
    steps: int | None
    last_step: int | None
    step_time_median_seconds: float | None
    tokens_per_second: float | None
    mfu: float | None
    goodput: float | None = Field(default=None, description="absent for a run with no steps")
    runtime_goodput: float | None = Field(default=None, description="goodput's runtime factor")
    productive_share: float | None
    straggler_spread: float | None
    slow_step_share: float | None
    replayed_steps: int | None
    health: RunHealthOut
    dataset: str | None = Field(description="name:version")
    code: str | None = Field(description="the commit")


class MatchedBucketOut(ApiModel):
    """A tenth of the matched steps: each run's mean."""

    from_step: int
    to_step: int
    values: dict[str, float | None] = Field(description="by run")


class MatchedMetricOut(ApiModel):
    """A scalar at the steps every run logged."""

    from_step: int
    to_step: int
    matched_steps: int
    buckets: list[MatchedBucketOut]
    tail: dict[str, float | None] = Field(description="the last bucket's values, by run")


class RegressionOut(ApiModel):
    """A check an evaluation failed against the model's baseline or its suite's bounds."""

    kind: str
    metric: str
    status: str
    reasons: list[str]
    candidate: float | None = None
    baseline: float | None = None
    difference: float | None = None
    baseline_version: str | None = None
    baseline_evaluation: str | None = None


class RunEvaluationOut(ApiModel):
    """A run's latest completed evaluation."""

    run_id: str
    evaluation_id: str
    model_id: str | None
    model_version: str | None
    suite: str = Field(description="name@version")
    regressions: list[RegressionOut] | None


class MetricDeltasOut(ApiModel):
    values: list[float | None] = Field(description="in run order")
    deltas: list[float | None] = Field(description="against the first run's")


class EvaluationDeltasOut(ApiModel):
    """Each run's latest completed evaluation, and each metric's change against the first's."""

    by_run: list[RunEvaluationOut | None]
    metrics: dict[str, MetricDeltasOut] = Field(description="by benchmark/metric")


class ContractDiffOut(ApiModel):
    values: list[str] = Field(description="each run's contract in a line")
    differences: list[list[str]] = Field(description="per run after the first: what differs")
    changed: bool


class ConclusionOut(ApiModel):
    """A likely conclusion for a run against the baseline."""

    baseline: str
    run: str
    cause: Literal[
        "none",
        "configuration",
        "infrastructure",
        "configuration and infrastructure",
        "data",
        "code",
        "contract",
        "unexplained",
    ]
    infrastructure_changed: bool
    contract_changed: bool
    configuration_changed: bool
    goodput_regressed: bool
    faults_regressed: bool
    evaluation_regressed: bool
    quality_regressed: bool
    speed_regressed: bool
    lines: list[str]


class CompareBasisOut(ApiModel):
    """How each figure of the comparison was computed."""

    step_time: str
    goodput: str
    productive_share: str
    matched_steps: str
    evaluations: str
    contract: str


class CompareOut(ApiModel):
    """Runs side by side, the first as the baseline."""

    runs: list[str]
    baseline: str
    config: list[ConfigDiffOut] = Field(description="changed keys first")
    dataset: ChangedValuesOut
    code: ChangedValuesOut
    side: list[CompareSideOut]
    matched_steps: dict[str, MatchedMetricOut] = Field(description="by scalar name")
    evaluations: EvaluationDeltasOut | None = Field(description="null when no run has one")
    contract: ContractDiffOut
    conclusions: list[ConclusionOut] = Field(description="per run after the first")
    basis: CompareBasisOut

    @classmethod
    def of(cls, c: Comparison) -> CompareOut:
        plain = dataclasses.asdict(c)  # fields by name, nested ones too
        for side in plain["side"]:
            if side["goodput"] is None:  # a run with no steps: no goodput keys at all
                del side["goodput"], side["runtime_goodput"]
        return cls.model_validate({**plain, "basis": _BASIS})


_BASIS = {  # how each figure of a comparison is computed
    "stepTime": "median over steps of the slowest rank's duration (last execution)",
    "goodput": "the job's goodput (runtime x program) as the run page and /v1/runs/{run_id}/"
    "goodput have it; runtimeGoodput its runtime factor",
    "productiveShare": "sum of retained steps' durations over first start to last end",
    "matchedSteps": "mean of each tenth of the steps every run logged; the conclusion reads "
    "the last tenth",
    "evaluations": "each run's latest completed evaluation (by runId); deltas against "
    "the first run's, metric by metric (benchmark/metric, performance/latency...)",
    "contract": "the software each run's ranks reported and the topology it was "
    "placed on; differences against the first run's (seed 003 s9.3.1)",
}
