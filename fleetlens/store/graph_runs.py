"""A run's records in the run graph: the scoped run look-up every part of the graph starts from,
its checkpoints and its artifacts (files by pointer and sha256)."""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import ConfigError, NotFound
from .graph_files import bare, sha256_of
from .graph_models import Artifact, Checkpoint
from .graph_types import ArtifactInfo, CheckpointInfo
from .metadata import MetadataStore
from .models import Run
from .scope import Scope
from .scoped import scoped

__all__ = ["ARTIFACT_KINDS", "GraphPart", "RunRecords", "checkpoint_info", "checkpoint_row",
           "run_row"]  # fmt: skip

ARTIFACT_KINDS = ("trace", "log", "eval_output", "checkpoint", "config", "other")


class GraphPart:
    """What every part of :class:`~.graph.GraphStore` holds: the metadata store's sessions."""

    def __init__(self, metadata: MetadataStore) -> None:
        self._session = metadata.session  # one database, one session factory


def run_row(s: Session, scope: Scope, run_id: str) -> Run:
    """The caller's run, or NotFound (also for another tenant's or project's)."""
    q = scoped(select(Run), scope, within="project").where(Run.run_id == run_id)
    run = s.scalars(q).first()
    if run is None:
        raise NotFound(f"run {run_id!r} does not exist")
    return run


def checkpoint_row(
    s: Session, scope: Scope, run_id: str, checkpoint_id: str = "", step: int | None = None
) -> Checkpoint:
    """A checkpoint of the caller's run, by id or by step (the newest at that step)."""
    run_row(s, scope, run_id)
    q = scoped(select(Checkpoint), scope).where(Checkpoint.run_id == run_id)
    if checkpoint_id:
        q = q.where(Checkpoint.checkpoint_id == checkpoint_id)
    elif step is not None:
        q = q.where(Checkpoint.step == step).order_by(Checkpoint.time.desc())
    else:
        raise ConfigError("name the checkpoint: its id, or the run's step")
    row = s.scalars(q).first()
    if row is None:
        what = checkpoint_id or f"at step {step}"
        raise NotFound(f"checkpoint {what} of run {run_id!r} does not exist")
    return row


class RunRecords(GraphPart):
    def record_checkpoint(
        self,
        scope: Scope,
        run_id: str,
        step: int,
        *,
        uri: str = "",
        job_id: str = "",
        size_bytes: int | None = None,
        checksum: str = "",
        duration_s: float | None = None,
        sync: bool = True,
        ok: bool = True,
        at: float | None = None,
        checkpoint_id: str = "",
        compute_checksum: bool = False,
    ) -> CheckpointInfo:
        """Record (or update) a checkpoint of a run; its id defaults to ``<run>@<step>``."""
        if compute_checksum and uri and not checksum:
            digest, size = sha256_of(uri)
            checksum, size_bytes = f"sha256:{digest}", size_bytes or size
        cid = checkpoint_id or f"{run_id}@{step}"
        with self._session() as s:
            run_row(s, scope, run_id)
            row = s.scalars(
                scoped(select(Checkpoint), scope).where(
                    Checkpoint.run_id == run_id, Checkpoint.checkpoint_id == cid
                )
            ).first()
            if row is None:
                row = Checkpoint(
                    tenant=scope.tenant,
                    run_id=run_id,
                    checkpoint_id=cid,
                    uri="",
                    checksum="",
                    job_id="",
                )
                s.add(row)
            row.step, row.sync, row.ok = int(step), bool(sync), bool(ok)
            row.uri = uri or row.uri
            row.job_id = job_id or row.job_id
            row.checksum = checksum or row.checksum
            row.size_bytes = size_bytes if size_bytes is not None else row.size_bytes
            row.duration_s = duration_s if duration_s is not None else row.duration_s
            row.time = at if at is not None else (row.time or time.time())
            return checkpoint_info(row)

    def checkpoints(self, scope: Scope, run_id: str) -> list[CheckpointInfo]:
        with self._session() as s:
            run_row(s, scope, run_id)
            rows = s.scalars(
                scoped(select(Checkpoint), scope)
                .where(Checkpoint.run_id == run_id)
                .order_by(Checkpoint.step, Checkpoint.time)
            ).all()
            return [checkpoint_info(r) for r in rows]

    def register_artifact(
        self,
        scope: Scope,
        run_id: str,
        name: str,
        uri: str,
        *,
        kind: str = "other",
        sha256: str = "",
        compute_checksum: bool = True,
    ) -> ArtifactInfo:
        """A file of a run, by pointer; its sha256 is read through fsspec unless given."""
        if kind not in ARTIFACT_KINDS:
            raise ConfigError(f"artifact kind {kind!r} is unknown; use one of {ARTIFACT_KINDS}")
        size: int | None = None
        if not sha256 and compute_checksum:
            sha256, size = sha256_of(uri)
        with self._session() as s:
            run_row(s, scope, run_id)
            row = s.scalars(
                scoped(select(Artifact), scope).where(
                    Artifact.run_id == run_id, Artifact.name == name
                )
            ).first()
            if row is None:
                row = Artifact(
                    tenant=scope.tenant, run_id=run_id, name=name, uri=uri, created_at=time.time()
                )
                s.add(row)
            row.kind, row.uri, row.sha256, row.size_bytes = kind, uri, bare(sha256), size
            return _artifact_info(row)

    def artifacts(self, scope: Scope, run_id: str) -> list[ArtifactInfo]:
        with self._session() as s:
            run_row(s, scope, run_id)
            rows = s.scalars(
                scoped(select(Artifact), scope)
                .where(Artifact.run_id == run_id)
                .order_by(Artifact.name)
            ).all()
            return [_artifact_info(r) for r in rows]


def checkpoint_info(r: Checkpoint) -> CheckpointInfo:
    return CheckpointInfo(
        checkpoint_id=r.checkpoint_id,
        run_id=r.run_id,
        job_id=r.job_id or None,
        step=r.step,
        uri=r.uri,
        size_bytes=r.size_bytes,
        checksum=r.checksum or None,
        duration_seconds=r.duration_s,
        sync=r.sync,
        ok=r.ok,
        time=r.time,
    )


def _artifact_info(r: Artifact) -> ArtifactInfo:
    return ArtifactInfo(
        name=r.name,
        kind=r.kind,
        uri=r.uri,
        size_bytes=r.size_bytes,
        sha256=r.sha256 or None,
        created_at=r.created_at,
    )
