"""Metadata tables of the run graph beyond runs and jobs (SQLAlchemy 2; migration 0004).

Experiment -> run (config on ``runs``; code, dataset link, launch command and environment on
``run_extras``) -> checkpoints (which job wrote them) -> model versions (optionally the
evaluation that judged them); dataset versions and artifacts (pointers and sha256 only; the
bytes live wherever fsspec reaches).
"""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Boolean, Float, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from .models import Base

__all__ = ["Artifact", "Checkpoint", "DatasetVersion", "Experiment", "ModelVersion", "RunExtra"]


class Experiment(Base):
    """A family of runs compared with each other."""

    __tablename__ = "experiments"
    __table_args__ = (UniqueConstraint("tenant", "experiment_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    project: Mapped[str] = mapped_column(String(256), default="")
    experiment_id: Mapped[str] = mapped_column(String(256))
    description: Mapped[str] = mapped_column(String(1024), default="")
    created_at: Mapped[float] = mapped_column(Float)


class RunExtra(Base):
    """What a run was made of besides its config: code, dataset, launch command, environment."""

    __tablename__ = "run_extras"
    __table_args__ = (UniqueConstraint("tenant", "run_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    run_id: Mapped[str] = mapped_column(String(256))
    code: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)  # repo, commit, dirty
    dataset_name: Mapped[str] = mapped_column(String(256), default="")
    dataset_version: Mapped[str] = mapped_column(String(256), default="")
    launch_command: Mapped[str] = mapped_column(String(8192), default="")
    environment: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    updated_at: Mapped[float] = mapped_column(Float)


class DatasetVersion(Base):
    """A content-addressed dataset version and its shards."""

    __tablename__ = "dataset_versions"
    __table_args__ = (UniqueConstraint("tenant", "name", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    project: Mapped[str] = mapped_column(String(256), default="")
    name: Mapped[str] = mapped_column(String(256))
    version: Mapped[str] = mapped_column(String(256))
    content_hash: Mapped[str] = mapped_column(String(128), default="")
    uri: Mapped[str] = mapped_column(String(2048), default="")
    shards: Mapped[list[dict[str, object]]] = mapped_column(JSON, default=list)
    created_at: Mapped[float] = mapped_column(Float)


class Checkpoint(Base):
    """A saved checkpoint: where, how big, its checksum, how long it took, who wrote it."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("tenant", "run_id", "checkpoint_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    run_id: Mapped[str] = mapped_column(String(256))
    checkpoint_id: Mapped[str] = mapped_column(String(256))
    job_id: Mapped[str] = mapped_column(String(256), default="")
    step: Mapped[int] = mapped_column(BigInteger, default=-1)
    uri: Mapped[str] = mapped_column(String(2048), default="")
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    checksum: Mapped[str] = mapped_column(String(128), default="")  # "sha256:<hex>"
    duration_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    sync: Mapped[bool] = mapped_column(Boolean, default=True)
    ok: Mapped[bool] = mapped_column(Boolean, default=True)
    time: Mapped[float] = mapped_column(Float, default=0.0)


class ModelVersion(Base):
    """A model version registered from a checkpoint (and, once judged, its evaluation)."""

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("tenant", "model_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    project: Mapped[str] = mapped_column(String(256), default="")
    model_id: Mapped[str] = mapped_column(String(256))
    version: Mapped[str] = mapped_column(String(256))
    run_id: Mapped[str] = mapped_column(String(256))
    checkpoint_id: Mapped[str] = mapped_column(String(256))
    evaluation_id: Mapped[str | None] = mapped_column(String(256), nullable=True)
    metrics: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(256), default="")


class Artifact(Base):
    """A file of a run (profiler trace, log, eval output): a pointer and its sha256."""

    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("tenant", "run_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    run_id: Mapped[str] = mapped_column(String(256))
    name: Mapped[str] = mapped_column(String(512))
    kind: Mapped[str] = mapped_column(String(64), default="other")
    uri: Mapped[str] = mapped_column(String(2048))
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    sha256: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[float] = mapped_column(Float)
