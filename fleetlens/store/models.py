"""Metadata tables of the run graph (SQLAlchemy 2). Alembic migrations create them."""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Float, Index, Integer, MetaData, String, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = ["Base", "Job", "RankEndRow", "Run", "TraceCaptureRow"]


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class Run(Base):
    """A training run: survives restarts; each restart is a new :class:`Job`."""

    __tablename__ = "runs"
    __table_args__ = (UniqueConstraint("tenant", "run_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    project: Mapped[str] = mapped_column(String(256), default="")
    experiment_id: Mapped[str] = mapped_column(String(256), default="")
    run_id: Mapped[str] = mapped_column(String(256))
    status: Mapped[str] = mapped_column(String(32), default="RUNNING")
    status_at: Mapped[float] = mapped_column(Float, default=0.0)
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)
    last_step: Mapped[int] = mapped_column(BigInteger, default=-1)
    world_size: Mapped[int] = mapped_column(Integer, default=0)
    config: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    # Bumped by every registry write of the run (data of it arrived, whatever its times): what
    # the analysis loop compares with its cursor's ``arrivals_seen`` to revisit the run.
    arrivals: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class Job(Base):
    """One scheduler allocation (attempt) of a run."""

    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("tenant", "run_id", "job_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    run_id: Mapped[str] = mapped_column(String(256))
    job_id: Mapped[str] = mapped_column(String(256))
    status: Mapped[str] = mapped_column(String(32), default="RUNNING")
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)
    last_step: Mapped[int] = mapped_column(BigInteger, default=-1)
    world_size: Mapped[int] = mapped_column(Integer, default=0)


class RankEndRow(Base):
    """A rank's last word in a job attempt (:mod:`fleetlens.lifecycle`); rank -1 is the
    job as a whole (an importer's or the simulator's event)."""

    __tablename__ = "rank_ends"
    __table_args__ = (UniqueConstraint("tenant", "run_id", "job_id", "rank"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    run_id: Mapped[str] = mapped_column(String(256))
    job_id: Mapped[str] = mapped_column(String(256))
    rank: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    at: Mapped[float] = mapped_column(Float)
    step: Mapped[int] = mapped_column(BigInteger, default=-1)
    message: Mapped[str] = mapped_column(String(1024), default="")


class Tenant(Base):
    """An organisation; every record belongs to exactly one. Quotas are per tenant (0 = none)."""

    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(256), unique=True)
    created_at: Mapped[float] = mapped_column(Float)
    ingest_bytes_per_s: Mapped[int] = mapped_column(BigInteger, default=0)
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    eval_shards_in_flight: Mapped[int] = mapped_column(Integer, default=0)
    ingested_bytes: Mapped[int] = mapped_column(BigInteger, default=0)


class Project(Base):
    """A project of a team inside a tenant; runs, models and evaluations belong to one."""

    __tablename__ = "projects"
    __table_args__ = (UniqueConstraint("tenant", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    team: Mapped[str] = mapped_column(String(256), default="")
    name: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[float] = mapped_column(Float)


class ApiToken(Base):
    """An API token: only its SHA-256 is stored; ``prefix`` identifies it to people."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(256), default="")
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    project: Mapped[str] = mapped_column(String(256), default="")
    role: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(256), default="")
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class AuditEntry(Base):
    """Append-only: who did what, when, to what, from where."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    actor: Mapped[str] = mapped_column(String(256))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(512), default="")
    detail: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    remote: Mapped[str] = mapped_column(String(128), default="")


class Finding(Base):
    """A detection of the analysis loop (straggler, hang, diagnosis), upserted on ``key``."""

    __tablename__ = "findings"
    __table_args__ = (UniqueConstraint("tenant", "run_id", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    run_id: Mapped[str] = mapped_column(String(256))
    key: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(32))
    diagnosis: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str] = mapped_column(String(64))
    confidence: Mapped[float] = mapped_column(Float, default=0.0)
    summary: Mapped[str] = mapped_column(String(1024), default="")
    step: Mapped[int] = mapped_column(BigInteger, default=-1)
    start_step: Mapped[int] = mapped_column(BigInteger, default=-1)
    end_step: Mapped[int] = mapped_column(BigInteger, default=-1)
    time: Mapped[float | None] = mapped_column(Float, nullable=True)
    job_id: Mapped[str] = mapped_column(String(256), default="")
    rack: Mapped[str] = mapped_column(String(256), default="")
    ranks: Mapped[list[int]] = mapped_column(JSON, default=list)
    nodes: Mapped[list[str]] = mapped_column(JSON, default=list)
    gpus: Mapped[list[str]] = mapped_column(JSON, default=list)
    evidence: Mapped[list[dict[str, object]]] = mapped_column(JSON, default=list)
    first_seen: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class AnalysisCursor(Base):
    """How far the analysis loop got in a run, and the state it carries to the next pass."""

    __tablename__ = "analysis_cursors"
    __table_args__ = (UniqueConstraint("tenant", "run_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    run_id: Mapped[str] = mapped_column(String(256))
    seen_last: Mapped[float] = mapped_column(Float, default=0.0)
    arrivals_seen: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    state: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    updated_at: Mapped[float] = mapped_column(Float)


class WorkloadBaseline(Base):
    """Healthy per-step figures of a workload signature (see fleetlens.analysis.baseline)."""

    __tablename__ = "workload_baselines"
    __table_args__ = (UniqueConstraint("tenant", "signature", "metric"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    signature: Mapped[str] = mapped_column(String(64))
    metric: Mapped[str] = mapped_column(String(64))
    values: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    updated_at: Mapped[float] = mapped_column(Float)


class TraceCaptureRow(Base):
    """A short profiler trace asked of a job's ranks (fleetlens.services.captures): a lagging
    rank and a healthy peer, or the ranks a person named; ``results`` holds each rank's
    breakdown of the captured steps once its trace is in."""

    __tablename__ = "trace_captures"
    __table_args__ = (
        Index("ix_trace_captures_run", "tenant", "run_id"),
        Index("ix_trace_captures_state", "state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256))
    run_id: Mapped[str] = mapped_column(String(256))
    job_id: Mapped[str] = mapped_column(String(256), default="")
    ranks: Mapped[list[int]] = mapped_column(JSON, default=list)
    from_step: Mapped[int] = mapped_column(BigInteger, default=0)
    steps: Mapped[int] = mapped_column(Integer)
    warmup: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(String(1024), default="")
    finding_key: Mapped[str] = mapped_column(String(256), default="")
    state: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(String(1024), default="")
    requested_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    results: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
