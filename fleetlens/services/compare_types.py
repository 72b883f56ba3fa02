"""What :mod:`fleetlens.services.compare` answers: runs side by side and a run's infrastructure,
as typed values (snake_case; the API makes their JSON). None stands for "not measured"."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..analysis.compare import Conclusion, SlowEpisode

__all__ = [
    "ChangedValues",
    "CompareSide",
    "Comparison",
    "ContractDiff",
    "EvaluationDeltas",
    "InfraFault",
    "InfraNode",
    "Infrastructure",
    "JobEnd",
    "MatchedBucket",
    "MatchedMetric",
    "MetricDeltas",
    "RunEvaluation",
    "RunHealth",
    "RunSpeed",
    "XidError",
]


@dataclass(frozen=True, slots=True)
class RunSpeed:
    """A run's speed over all its steps, as the engine names its columns."""

    run_id: str | None = None
    n_steps: int | None = None
    last_step: int | None = None
    median_step_s: float | None = None
    mean_step_s: float | None = None
    tokens_per_s: float | None = None
    spread: float | None = None
    ranks: int | None = None
    slow_share: float | None = None
    productive_share: float | None = None
    replayed_steps: int | None = None
    t_first: float | None = None
    t_last: float | None = None


@dataclass(frozen=True, slots=True)
class MatchedBucket:
    """A tenth of the matched steps: each run's mean (None: not finite)."""

    from_step: int
    to_step: int
    values: dict[str, float | None]


@dataclass(frozen=True, slots=True)
class MatchedMetric:
    """A scalar at the steps every run logged: the range, its tenths, the last tenth's values."""

    from_step: int
    to_step: int
    matched_steps: int
    buckets: list[MatchedBucket]
    tail: dict[str, float | None]


@dataclass(frozen=True, slots=True)
class RunHealth:
    """A run's fault and lifecycle events by kind, the nodes they name, nodes and GPUs used;
    in a comparison, the infrastructure issues its conclusion reads."""

    faults: dict[str, int]
    fault_nodes: list[str]
    nodes: int
    gpus: int
    issues: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class InfraNode:
    node: str
    gpu: int
    gpu_uuid: str | None
    rack: str | None
    jobs: list[str]


@dataclass(frozen=True, slots=True)
class InfraFault:
    time: float
    kind: str
    node: str | None
    gpu: int | None
    step: int
    message: str
    same_run: bool


@dataclass(frozen=True, slots=True)
class XidError:
    node: str
    gpu: int
    first: float
    max_xid: float | None
    samples: int


@dataclass(frozen=True, slots=True)
class JobEnd:
    time: float
    kind: str
    job_id: str | None
    message: str
    attrs: str


@dataclass(frozen=True, slots=True)
class Infrastructure:
    """Run -> the nodes and GPUs it used -> their faults during the run; its slow episodes
    (:func:`fleetlens.analysis.compare.slow_episodes`) and how each job attempt ended."""

    run_id: str
    nodes: list[InfraNode]
    faults: list[InfraFault]
    xid_errors: list[XidError]
    job_ends: list[JobEnd]
    slow_episodes: list[SlowEpisode]
    speed: RunSpeed | None


@dataclass(frozen=True, slots=True)
class ChangedValues:
    values: list[str | None]
    changed: bool


@dataclass(frozen=True, slots=True)
class CompareSide:
    """One run's figures; ``goodput`` and ``runtime_goodput`` None for a run with no steps."""

    run_id: str
    steps: int | None
    last_step: int | None
    step_time_median_seconds: float | None
    tokens_per_second: float | None
    mfu: float | None
    goodput: float | None
    runtime_goodput: float | None
    productive_share: float | None
    straggler_spread: float | None
    slow_step_share: float | None
    replayed_steps: int | None
    health: RunHealth
    dataset: str | None
    code: str | None


@dataclass(frozen=True, slots=True)
class RunEvaluation:
    """A run's latest completed evaluation; ``regressions`` as the evaluation stored them."""

    run_id: str
    evaluation_id: str
    model_id: str | None
    model_version: str | None
    suite: str
    regressions: list[dict[str, Any]] | None


@dataclass(frozen=True, slots=True)
class MetricDeltas:
    values: list[float | None]
    deltas: list[float | None]


@dataclass(frozen=True, slots=True)
class EvaluationDeltas:
    by_run: list[RunEvaluation | None]
    metrics: dict[str, MetricDeltas]


@dataclass(frozen=True, slots=True)
class ContractDiff:
    values: list[str]
    differences: list[list[str]]
    changed: bool


@dataclass(frozen=True, slots=True)
class Comparison:
    """Runs side by side, the first the baseline. ``config`` and ``conclusions`` are as
    :func:`fleetlens.analysis.compare.config_diff` and ``conclude`` make them."""

    runs: list[str]
    baseline: str
    config: list[dict[str, Any]]
    dataset: ChangedValues
    code: ChangedValues
    side: list[CompareSide]
    matched_steps: dict[str, MatchedMetric]
    evaluations: EvaluationDeltas | None
    contract: ContractDiff
    conclusions: list[Conclusion]
