"""Metadata tables of the run graph (SQLAlchemy 2). Alembic migrations create them."""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Float, Integer, MetaData, String, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = ["Base", "Job", "Run"]


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
