"""Alert and incident tables (SQLAlchemy 2; migration 0005), silences (0009)."""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Boolean, Float, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from ..store.models import Base

__all__ = ["Alert", "Incident", "Preservation", "Silence"]


class Alert(Base):
    """One alert, identified by its fingerprint; firing -> resolved, acknowledged by someone."""

    __tablename__ = "alerts"
    __table_args__ = (UniqueConstraint("tenant", "fingerprint"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    alertname: Mapped[str] = mapped_column(String(128))
    severity: Mapped[str] = mapped_column(String(16))
    audience: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16))
    run_id: Mapped[str] = mapped_column(String(256), default="")
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    annotations: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    finding_key: Mapped[str] = mapped_column(String(256), default="")
    step: Mapped[int] = mapped_column(BigInteger, default=-1)
    starts_at: Mapped[float] = mapped_column(Float)
    ends_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)
    notified_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    acked_by: Mapped[str] = mapped_column(String(256), default="")
    acked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    incident_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)


class Incident(Base):
    """The alerts, findings and events of one run's trouble, gathered in one place."""

    __tablename__ = "incidents"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    run_id: Mapped[str] = mapped_column(String(256), default="")
    title: Mapped[str] = mapped_column(String(512))
    severity: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    opened_at: Mapped[float] = mapped_column(Float)
    closed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    findings: Mapped[list[str]] = mapped_column(JSON, default=list)


class Preservation(Base):
    """A failure window to keep at full resolution beyond retention (T-10 min to T+10 min)."""

    __tablename__ = "preservations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    run_id: Mapped[str] = mapped_column(String(256))
    nodes: Mapped[list[str]] = mapped_column(JSON, default=list)
    fingerprint: Mapped[str] = mapped_column(String(64))
    t0: Mapped[float] = mapped_column(Float)
    t1: Mapped[float] = mapped_column(Float)
    copied_until: Mapped[float] = mapped_column(Float)


class Silence(Base):
    """While it lasts, alerts whose labels match all its matchers notify no one (they still
    fire, and show as silenced). ``infra``: made by infrastructure on-call for every tenant's
    infrastructure alerts (``tenant`` is then the on-call token's own)."""

    __tablename__ = "silences"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(256), index=True)
    infra: Mapped[bool] = mapped_column(Boolean, default=False)
    matchers: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    starts_at: Mapped[float] = mapped_column(Float)
    ends_at: Mapped[float] = mapped_column(Float)
    comment: Mapped[str] = mapped_column(String(1024), default="")
    created_by: Mapped[str] = mapped_column(String(256), default="")
    created_at: Mapped[float] = mapped_column(Float)
