"""The JSON the run graph's routes answer (:mod:`fleetlens.api.graph`): lineage both ways, run
comparison, checkpoints, model versions, datasets and artifacts.

Built by :mod:`fleetlens.store.graph` (lineage, registrations) and
:mod:`fleetlens.services.compare` (comparison, a run's infrastructure); the routes answer with
``response_model_exclude_unset`` where a key is present only in some answers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import ConfigDict, Field

from ..services.compare_types import Comparison, Infrastructure
from .models import ApiModel

__all__ = [
    "ArtifactListOut",
    "ArtifactOut",
    "CheckpointListOut",
    "CheckpointOut",
    "CheckpointRecordedOut",
    "CompareOut",
    "DatasetOut",
    "DrilldownOut",
    "ModelLineageOut",
    "ModelListOut",
    "ModelRegisteredOut",
    "ModelVersionOut",
    "RunGraphOut",
    "RunLineageOut",
]


class _EngineKeys(ApiModel):
    """Keys as the telemetry engine names its columns (snake_case on the wire too)."""

    model_config = ConfigDict(alias_generator=None)


# ---- registrations ------------------------------------------------------------------------
class TriggeredOut(ApiModel):
    """The evaluations the project's triggers started on this registration."""

    evaluations: list[str] = Field(description="ids of the evaluations started")
    errors: list[str] = Field(description="triggers that could not start one, and why")


class CheckpointOut(ApiModel):
    """A saved checkpoint: where, how big, its checksum, how long it took, who wrote it."""

    checkpoint_id: str = Field(description="`<run>@<step>` unless named")
    run_id: str
    job_id: str | None = Field(description="the job attempt that wrote it")
    step: int
    uri: str
    size_bytes: int | None
    checksum: str | None = Field(description="sha256:<hex>; null when unknown")
    duration_seconds: float | None = Field(description="how long the save took")
    sync: bool = Field(description="the save blocked training")
    ok: bool = Field(description="the save succeeded")
    time: float = Field(description="UNIX seconds")


class CheckpointRecordedOut(CheckpointOut):
    """The checkpoint as recorded; a verified one (checksum known, ok) fires the triggers."""

    triggered: TriggeredOut | None = Field(
        default=None, description="present only for a verified checkpoint"
    )


class CheckpointListOut(ApiModel):
    """A run's checkpoints, by step."""

    run_id: str
    checkpoints: list[CheckpointOut]


class ArtifactOut(ApiModel):
    """A file of a run (profiler trace, log, eval output): a pointer and its sha256."""

    name: str
    kind: Literal["trace", "log", "eval_output", "checkpoint", "config", "other"]
    uri: str
    size_bytes: int | None = Field(description="known when the server read the file")
    sha256: str | None = Field(description="hex digest; null when unknown")
    created_at: float = Field(description="UNIX seconds")


class ArtifactListOut(ApiModel):
    """A run's artifacts, by name."""

    run_id: str
    artifacts: list[ArtifactOut]


class ModelVersionOut(ApiModel):
    """A model version registered from a checkpoint of a run."""

    model_id: str
    version: str
    run_id: str
    checkpoint_id: str
    evaluation_id: str | None = Field(description="the evaluation that judged it, if any")
    metrics: dict[str, float] = Field(
        description="figures by name: as registered, and each of its evaluation's "
        "benchmark/metric means"
    )
    created_at: float = Field(description="UNIX seconds")
    created_by: str


class ModelRegisteredOut(ModelVersionOut):
    """The registered version and the evaluations its registration started."""

    triggered: TriggeredOut


class ModelListOut(ApiModel):
    """Registered model versions, by model, oldest first."""

    models: list[ModelVersionOut]


class DatasetOut(ApiModel):
    """A registered dataset version and its shards."""

    name: str
    version: str
    content_hash: str | None
    uri: str | None
    shards: list[dict[str, Any]] = Field(description="as registered: [{uri, sha256, ...}]")
    created_at: float = Field(description="UNIX seconds")


class DatasetRefOut(ApiModel):
    """A dataset a run names that was never registered: its name and version only."""

    name: str
    version: str


# ---- lineage ------------------------------------------------------------------------------
class JobOut(ApiModel):
    """A job attempt of the run."""

    job_id: str
    status: str
    first_seen: float
    last_seen: float
    last_step: int


class LineageRunOut(ApiModel):
    """What a run was made of: config, code, dataset, launch command, environment."""

    run_id: str
    project: str
    experiment_id: str | None
    config: dict[str, Any]
    code: dict[str, Any] = Field(description="{commit} or {repo, commit, dirty}; {} when unsaid")
    dataset: DatasetOut | DatasetRefOut | None
    launch_command: str | None
    environment: dict[str, Any]


class RunGraphOut(LineageRunOut):
    """A run's lineage: what it was made of, its jobs, checkpoints and model versions."""

    jobs: list[JobOut]
    checkpoints: list[CheckpointOut]
    model_versions: list[ModelVersionOut]


class InfraNodeOut(ApiModel):
    """A (node, GPU) the run was placed on."""

    node: str
    gpu: int = Field(description="GPU index; -1 on CPU")
    gpu_uuid: str | None
    rack: str | None
    jobs: list[str] = Field(description="the job attempts placed there")


class InfraFaultOut(ApiModel):
    """A fault event of the run, or of another run on its nodes while it was placed there."""

    time: float
    kind: str
    node: str | None
    gpu: int | None
    step: int
    message: str
    same_run: bool = Field(description="false: another run's event on a node this run used")


class XidErrorOut(ApiModel):
    """XID errors of one GPU the run used, while it was placed there."""

    node: str
    gpu: int
    first: float = Field(description="UNIX seconds of the first sample with an XID")
    max_xid: float | None
    samples: int


class JobEndOut(ApiModel):
    """A failure or preemption event of the run."""

    time: float
    kind: Literal["failure", "preemption"]
    job_id: str | None
    message: str
    attrs: str = Field(description="the event's attrs, a JSON object as text")


class SlowEpisodeOut(ApiModel):
    """Consecutive logged steps slower than twice the run's median step."""

    from_step: int
    to_step: int
    points: int
    median_seconds: float
    run_median_seconds: float
    slowdown: float = Field(description="the episode's median over the run's")


class RunSpeedOut(_EngineKeys):
    """The run's speed over all its steps, as the engine names it; {} before the first step."""

    run_id: str | None = None
    n_steps: int | None = None
    last_step: int | None = None
    median_step_s: float | None = None
    mean_step_s: float | None = None
    tokens_per_s: float | None = None
    spread: float | None = Field(default=None, description="slowest rank over the mean, - 1")
    ranks: int | None = None
    slow_share: float | None = Field(default=None, description="steps over 2x the median")
    productive_share: float | None = None
    replayed_steps: int | None = None
    t_first: float | None = Field(default=None, description="UNIX seconds: first step start")
    t_last: float | None = Field(default=None, description="UNIX seconds: last step end")


class InfrastructureOut(ApiModel):
    """Run -> the nodes and GPUs it used -> their faults during the run; slow episodes and how
    each job attempt ended."""

    run_id: str
    nodes: list[InfraNodeOut]
    faults: list[InfraFaultOut]
    xid_errors: list[XidErrorOut]
    job_ends: list[JobEndOut]
    slow_episodes: list[SlowEpisodeOut]
    speed: RunSpeedOut

    @classmethod
    def of(cls, i: Infrastructure) -> InfrastructureOut:
        plain = dataclasses.asdict(i)  # fields by name, nested ones too (the models take either)
        return cls.model_validate({**plain, "speed": plain["speed"] or {}})  # {}: no step yet


class RunLineageOut(RunGraphOut):
    """A run's lineage and the infrastructure it ran on."""

    infrastructure: InfrastructureOut


class EvaluationRefOut(ApiModel):
    evaluation_id: str


class FileCheckOut(ApiModel):
    """A file re-read and its sha256 compared with the one registered."""

    what: Literal["checkpoint", "dataset shard"]
    uri: str
    ok: bool | None = Field(description="null: no checksum stored to compare with")
    reason: str = Field(default="", description="why it was not compared, or not read")
    expected: str = Field(default="", description="the registered sha256 (hex)")
    actual: str = Field(default="", description="the sha256 read now (hex)")


class VerificationOut(ApiModel):
    """Whether the checkpoint and the dataset's shards are still what was registered."""

    ok: bool | None = Field(description="null: the server may not read the files")
    checks: list[FileCheckOut] = Field(default_factory=list)
    reason: str = Field(default="", description="why the server did not read the files")


class ModelLineageOut(ApiModel):
    """Model version -> evaluation -> checkpoint -> step -> run -> config, dataset, code."""

    model: ModelVersionOut
    evaluation: EvaluationRefOut | None
    checkpoint: CheckpointOut
    step: int
    run: LineageRunOut
    verification: VerificationOut | None = Field(default=None, description="with ?verify=true")


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


class MetricPairOut(ApiModel):
    baseline: float | None
    version: float


class DrilldownOut(ApiModel):
    """A model version's run against the baseline version's run."""

    path: list[str]
    metrics: dict[str, MetricPairOut]
    model: ModelLineageOut
    baseline: ModelLineageOut
    comparison: CompareOut | None = Field(description="null when both come from one run")
    conclusion: str
