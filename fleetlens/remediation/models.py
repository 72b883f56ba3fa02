"""The remediation actions table (SQLAlchemy 2; migration 0007)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from ..store.models import Base

__all__ = ["Remediation"]


class Remediation(Base):
    """One decision to take a node out of a run, and everything that happened to carry it out.

    ``phases`` maps a phase name to ``[started, ended]`` (epoch seconds); ``acks`` keeps what the
    job's ranks answered; ``finding_key``, ``alert_id`` and ``incident_id`` link the action to
    what raised it."""

    __tablename__ = "remediations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    run_id: Mapped[str] = mapped_column(String(256), index=True)
    job_id: Mapped[str] = mapped_column(String(256), default="")
    node: Mapped[str] = mapped_column(String(256))
    ranks: Mapped[list[int]] = mapped_column(JSON, default=list)
    reason: Mapped[str] = mapped_column(String(64))
    summary: Mapped[str] = mapped_column(String(1024), default="")
    finding_key: Mapped[str] = mapped_column(String(256), default="")
    alert_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    incident_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    mode: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(32))
    decided_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    approved_by: Mapped[str] = mapped_column(String(256), default="")
    world_before: Mapped[int] = mapped_column(Integer, default=0)
    world_after: Mapped[int] = mapped_column(Integer, default=0)
    stop_step: Mapped[int] = mapped_column(BigInteger, default=-1)
    resume_step: Mapped[int] = mapped_column(BigInteger, default=-1)
    checkpoint: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    phases: Mapped[dict[str, list[float | None]]] = mapped_column(JSON, default=dict)
    acks: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    actuators: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    cost: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    error: Mapped[str] = mapped_column(String(1024), default="")
