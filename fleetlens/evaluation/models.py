"""Metadata tables of evaluation (SQLAlchemy 2; migration 0006).

Model aliases and the trail of every move; evaluations and their shards (the scheduler's
queue, one row per evaluation_id + dataset partition); quality-gate decision records.
"""

from __future__ import annotations

from sqlalchemy import JSON, Boolean, Float, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from ..store.models import Base

__all__ = [
    "AliasMove", "EvalShard", "EvalSuite", "EvalTrigger", "Evaluation", "GateDecision",
    "ModelAlias",
]  # fmt: skip


class ModelAlias(Base):
    """Where a named pointer (``candidate``, ``canary``, ``production``, ...) points now."""

    __tablename__ = "model_aliases"
    __table_args__ = (UniqueConstraint("tenant", "model_id", "alias"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    project: Mapped[str] = mapped_column(String(256), default="")
    model_id: Mapped[str] = mapped_column(String(256))
    alias: Mapped[str] = mapped_column(String(128))
    version: Mapped[str] = mapped_column(String(256))
    updated_at: Mapped[float] = mapped_column(Float)
    updated_by: Mapped[str] = mapped_column(String(256), default="")


class AliasMove(Base):
    """One move of an alias: from, to, who, why, and the gate decision (or override) behind it."""

    __tablename__ = "model_alias_moves"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    model_id: Mapped[str] = mapped_column(String(256))
    alias: Mapped[str] = mapped_column(String(128))
    from_version: Mapped[str] = mapped_column(String(256), default="")
    to_version: Mapped[str] = mapped_column(String(256))
    decision_id: Mapped[str] = mapped_column(String(64), default="")
    override: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str] = mapped_column(String(2048), default="")
    actor: Mapped[str] = mapped_column(String(256), default="")
    at: Mapped[float] = mapped_column(Float)


class Evaluation(Base):
    """One evaluation request: what was judged, with what, and what came out."""

    __tablename__ = "evaluations"
    __table_args__ = (UniqueConstraint("tenant", "evaluation_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    project: Mapped[str] = mapped_column(String(256), default="")
    evaluation_id: Mapped[str] = mapped_column(String(64))
    model_id: Mapped[str] = mapped_column(String(256), default="")
    model_version: Mapped[str] = mapped_column(String(256), default="")
    run_id: Mapped[str] = mapped_column(String(256), default="")
    checkpoint_id: Mapped[str] = mapped_column(String(256), default="")
    adapter: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    suite: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    priority: Mapped[int] = mapped_column(Integer, default=2)
    deadline: Mapped[float | None] = mapped_column(Float, nullable=True)
    state: Mapped[str] = mapped_column(String(16), default="QUEUED")
    cache_key: Mapped[str] = mapped_column(String(64), index=True)
    cached_from: Mapped[str] = mapped_column(String(64), default="")
    provenance: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    metrics: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    error: Mapped[str] = mapped_column(String(4096), default="")
    created_at: Mapped[float] = mapped_column(Float)
    completed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_by: Mapped[str] = mapped_column(String(256), default="")
    trigger_id: Mapped[str] = mapped_column(String(64), default="", server_default="")
    # Against the baseline (the production alias's evaluation), once COMPLETED: a list of
    # {kind: safety|benchmark|latency, metric, ...}; None: not compared (no model, no baseline).
    regressions: Mapped[list[dict[str, object]] | None] = mapped_column(
        JSON(none_as_null=True), nullable=True
    )


class EvalSuite(Base):
    """A named, versioned suite (benchmarks, gates, decoding), registered once (migration 0008)."""

    __tablename__ = "eval_suites"
    __table_args__ = (UniqueConstraint("tenant", "name", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    name: Mapped[str] = mapped_column(String(128))
    version: Mapped[str] = mapped_column(String(128))
    spec: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    spec_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(256), default="")


class EvalTrigger(Base):
    """A policy: in this project, registering a model version (or a verified checkpoint, or
    moving an alias) starts an evaluation on this suite."""

    __tablename__ = "eval_triggers"
    __table_args__ = (UniqueConstraint("tenant", "trigger_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    trigger_id: Mapped[str] = mapped_column(String(64))
    project: Mapped[str] = mapped_column(String(256), default="")
    on: Mapped[str] = mapped_column(String(32))
    model_id: Mapped[str] = mapped_column(String(256), default="")
    alias: Mapped[str] = mapped_column(String(128), default="")
    suite: Mapped[str] = mapped_column(String(260))
    adapter: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    priority: Mapped[str] = mapped_column(String(4), default="P1")
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(256), default="")


class EvalShard(Base):
    """A partition of one benchmark of an evaluation: the unit that is leased and retried."""

    __tablename__ = "eval_shards"
    __table_args__ = (UniqueConstraint("tenant", "evaluation_id", "shard_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    project: Mapped[str] = mapped_column(String(256), default="")
    evaluation_id: Mapped[str] = mapped_column(String(64))
    shard_index: Mapped[int] = mapped_column(Integer)
    benchmark: Mapped[str] = mapped_column(String(256))
    start: Mapped[int] = mapped_column(Integer)
    stop: Mapped[int] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer, default=2)
    deadline: Mapped[float] = mapped_column(Float)  # no deadline: +inf stand-in (far future)
    locality: Mapped[str] = mapped_column(String(256), default="")
    state: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    lease_token: Mapped[str] = mapped_column(String(64), default="")
    worker_id: Mapped[str] = mapped_column(String(256), default="")
    lease_expires: Mapped[float] = mapped_column(Float, default=0.0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    done: Mapped[int] = mapped_column(Integer, default=0)
    scores: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    error: Mapped[str] = mapped_column(String(4096), default="")
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class GateDecision(Base):
    """A quality-gate verdict on a candidate against a baseline, with the evidence."""

    __tablename__ = "gate_decisions"
    __table_args__ = (UniqueConstraint("tenant", "decision_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    decision_id: Mapped[str] = mapped_column(String(64))
    model_id: Mapped[str] = mapped_column(String(256))
    candidate_version: Mapped[str] = mapped_column(String(256))
    baseline_version: Mapped[str] = mapped_column(String(256), default="")
    candidate_evaluation: Mapped[str] = mapped_column(String(64))
    baseline_evaluation: Mapped[str] = mapped_column(String(64), default="")
    passed: Mapped[bool] = mapped_column(Boolean)
    report: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    actor: Mapped[str] = mapped_column(String(256), default="")
    created_at: Mapped[float] = mapped_column(Float)
