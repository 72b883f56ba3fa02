"""The JSON the run graph's routes answer (:mod:`fleetlens.api.graph`,
:mod:`fleetlens.api.graph_registration`): lineage both ways, checkpoints, model versions,
datasets and artifacts; a run comparison's is :mod:`fleetlens.api.compare_models`.

Built from the store's values (:mod:`fleetlens.store.graph_types`) and
:mod:`fleetlens.services.compare` (a run's infrastructure); the routes answer with
``response_model_exclude_unset`` where a key is present only in some answers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field

from ..services.compare_types import Infrastructure
from ..store.graph_types import (
    ArtifactInfo,
    CheckpointInfo,
    DatasetInfo,
    DatasetRef,
    JobLineage,
    ModelLineage,
    ModelVersionInfo,
    RunLineage,
)
from .compare_models import CompareOut
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

    @classmethod
    def of(cls, triggered: object) -> TriggeredOut:
        """From what the evaluation store's ``fire`` answered."""
        return cls.model_validate(triggered, from_attributes=not isinstance(triggered, Mapping))


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

    @classmethod
    def of(cls, c: CheckpointInfo) -> CheckpointOut:
        return cls(**_checkpoint_fields(c))


def _checkpoint_fields(c: CheckpointInfo) -> dict[str, Any]:
    return {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}


class CheckpointRecordedOut(CheckpointOut):
    """The checkpoint as recorded; a verified one (checksum known, ok) fires the triggers."""

    triggered: TriggeredOut | None = Field(
        default=None, description="present only for a verified checkpoint"
    )

    @classmethod
    def recorded(cls, c: CheckpointInfo, triggered: object = None) -> CheckpointRecordedOut:
        """``triggered``: what the triggers started (a verified checkpoint only)."""
        if triggered is None:
            return cls(**_checkpoint_fields(c))
        return cls(**_checkpoint_fields(c), triggered=TriggeredOut.of(triggered))


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

    @classmethod
    def of(cls, a: ArtifactInfo) -> ArtifactOut:
        return cls.model_validate(dataclasses.asdict(a))


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

    @classmethod
    def of(cls, m: ModelVersionInfo) -> ModelVersionOut:
        return cls.model_validate(dataclasses.asdict(m))


class ModelRegisteredOut(ModelVersionOut):
    """The registered version and the evaluations its registration started."""

    triggered: TriggeredOut

    @classmethod
    def registered(cls, m: ModelVersionInfo, triggered: object) -> ModelRegisteredOut:
        return cls.model_validate(
            {**dataclasses.asdict(m), "triggered": TriggeredOut.of(triggered)}
        )


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

    @classmethod
    def of(cls, d: DatasetInfo) -> DatasetOut:
        return cls(
            name=d.name,
            version=d.version,
            content_hash=d.content_hash,
            uri=d.uri,
            shards=list(d.shards),
            created_at=d.created_at,
        )


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

    @classmethod
    def of(cls, j: JobLineage) -> JobOut:
        return cls.model_validate(dataclasses.asdict(j))


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

    @classmethod
    def of(cls, r: RunLineage) -> LineageRunOut:
        return cls(**_made_of(r))


def _made_of(r: RunLineage) -> dict[str, Any]:
    """What a run was made of, as :class:`LineageRunOut`'s fields."""
    ds = r.dataset
    return {
        "run_id": r.run_id,
        "project": r.project,
        "experiment_id": r.experiment_id,
        "config": r.config,
        "code": r.code,
        "dataset": DatasetOut.of(ds)
        if isinstance(ds, DatasetInfo)
        else DatasetRefOut(name=ds.name, version=ds.version)
        if isinstance(ds, DatasetRef)
        else None,
        "launch_command": r.launch_command,
        "environment": r.environment,
    }


def _graph_of(r: RunLineage) -> dict[str, Any]:
    """A run's lineage, as :class:`RunGraphOut`'s fields."""
    return {
        **_made_of(r),
        "jobs": [JobOut.of(j) for j in r.jobs],
        "checkpoints": [CheckpointOut.of(c) for c in r.checkpoints],
        "model_versions": [ModelVersionOut.of(m) for m in r.model_versions],
    }


class RunGraphOut(LineageRunOut):
    """A run's lineage: what it was made of, its jobs, checkpoints and model versions."""

    jobs: list[JobOut]
    checkpoints: list[CheckpointOut]
    model_versions: list[ModelVersionOut]

    @classmethod
    def of(cls, r: RunLineage) -> RunGraphOut:
        return cls(**_graph_of(r))


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

    @classmethod
    def with_infrastructure(cls, r: RunLineage, infra: Infrastructure) -> RunLineageOut:
        return cls(**_graph_of(r), infrastructure=InfrastructureOut.of(infra))


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

    @classmethod
    def of(cls, m: ModelLineage, verification: Mapping[str, Any] | None = None) -> ModelLineageOut:
        """``verification``: the store's (``m.verification``) unless given."""
        checked = verification if verification is not None else m.verification
        fields: dict[str, Any] = {
            "model": ModelVersionOut.of(m.model),
            "evaluation": None
            if m.evaluation_id is None
            else EvaluationRefOut(evaluation_id=m.evaluation_id),
            "checkpoint": CheckpointOut.of(m.checkpoint),
            "step": m.step,
            "run": LineageRunOut.of(m.run),
        }
        if checked is not None:
            fields["verification"] = VerificationOut.model_validate(checked)
        return cls(**fields)


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
