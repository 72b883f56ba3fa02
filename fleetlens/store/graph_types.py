"""The run graph's values as the store answers them: checkpoints, artifacts, model versions,
datasets, and lineage both ways. The API's models (:mod:`fleetlens.api.graph_models`) make
their JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "ArtifactInfo",
    "CheckpointInfo",
    "DatasetInfo",
    "DatasetRef",
    "JobLineage",
    "ModelLineage",
    "ModelVersionInfo",
    "RunLineage",
]


@dataclass(frozen=True)
class CheckpointInfo:
    """A saved checkpoint: where, how big, its checksum, how long it took, who wrote it."""

    checkpoint_id: str
    """``<run>@<step>`` unless named."""
    run_id: str
    job_id: str | None
    """The job attempt that wrote it; None when unknown."""
    step: int
    uri: str
    size_bytes: int | None
    checksum: str | None
    """``sha256:<hex>``; None when unknown."""
    duration_seconds: float | None
    """How long the save took."""
    sync: bool
    """The save blocked training."""
    ok: bool
    """The save succeeded."""
    time: float
    """UNIX seconds."""


@dataclass(frozen=True)
class ArtifactInfo:
    """A file of a run (profiler trace, log, eval output): a pointer and its sha256."""

    name: str
    kind: str
    uri: str
    size_bytes: int | None
    """Known when the server read the file."""
    sha256: str | None
    """Hex digest; None when unknown."""
    created_at: float


@dataclass(frozen=True)
class ModelVersionInfo:
    """A model version registered from a checkpoint of a run."""

    model_id: str
    version: str
    run_id: str
    checkpoint_id: str
    evaluation_id: str | None
    """The evaluation that judged it, if any."""
    metrics: dict[str, object]
    """Figures by name: as registered, and each of its evaluation's benchmark/metric means."""
    created_at: float
    created_by: str


@dataclass(frozen=True)
class DatasetInfo:
    """A registered dataset version and its shards."""

    name: str
    version: str
    content_hash: str | None
    uri: str | None
    shards: list[dict[str, Any]]
    """As registered: ``[{uri, sha256, ...}]``."""
    created_at: float


@dataclass(frozen=True)
class DatasetRef:
    """A dataset a run names that was never registered: its name and version only."""

    name: str
    version: str


@dataclass(frozen=True)
class JobLineage:
    """A job attempt of a run."""

    job_id: str
    status: str
    first_seen: float
    last_seen: float
    last_step: int


@dataclass(frozen=True)
class RunLineage:
    """What a run was made of (config, code, dataset, launch command, environment,
    experiment), its jobs, checkpoints and model versions."""

    run_id: str
    project: str
    experiment_id: str | None
    config: dict[str, Any]
    code: dict[str, Any]
    """``{commit}`` or ``{repo, commit, dirty}``; {} when unsaid."""
    dataset: DatasetInfo | DatasetRef | None
    launch_command: str | None
    environment: dict[str, Any]
    jobs: list[JobLineage]
    checkpoints: list[CheckpointInfo]
    model_versions: list[ModelVersionInfo]


@dataclass(frozen=True)
class ModelLineage:
    """Model version -> evaluation (optional) -> checkpoint -> step -> run."""

    model: ModelVersionInfo
    evaluation_id: str | None
    checkpoint: CheckpointInfo
    run: RunLineage
    verification: dict[str, Any] | None = None
    """With ``verify``: ``{ok, checks}``, the checkpoint and the dataset's shards re-read."""

    @property
    def step(self) -> int:
        return self.checkpoint.step
