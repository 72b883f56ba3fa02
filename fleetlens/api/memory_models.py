"""The JSON of a run's memory per rank (:mod:`fleetlens.api.memory`), built from
:mod:`fleetlens.services.memory`'s values."""

from __future__ import annotations

from pydantic import Field

from ..analysis.memory import PoolMemory
from ..services.memory import RunMemory
from .models import ApiModel

__all__ = ["ClimbOut", "MemoryOut", "MemorySeriesOut", "PoolOut"]


class ClimbOut(ApiModel):
    """A pool's use over steps: where it started and ended and its least-squares slope."""

    from_step: int
    from_bytes: float
    to_step: int
    to_bytes: float
    per_step_bytes: float | None = Field(description="bytes a step over the newest 50 samples")


class PoolOut(ApiModel):
    """One rank's device memory (the CUDA caching allocator's) or process memory."""

    rank: int
    pool: str = Field(description="device or host")
    used_bytes: float = Field(description="at the last sample")
    peak_bytes: float
    limit_bytes: float | None = Field(description="the device's capacity; the process's limit")
    headroom_bytes: float | None = Field(description="limit - peak")
    headroom_share: float | None = Field(description="headroom over the limit")
    climb: ClimbOut | None
    steps_to_limit: float | None = Field(
        description="steps left until the limit at the climb's slope; null when flat"
    )

    @classmethod
    def of(cls, p: PoolMemory) -> PoolOut:
        c = p.climb
        return cls(
            rank=p.rank,
            pool=p.pool,
            used_bytes=p.used,
            peak_bytes=p.peak,
            limit_bytes=p.limit,
            headroom_bytes=p.headroom,
            headroom_share=None if p.headroom is None or not p.limit else p.headroom / p.limit,
            climb=None
            if c is None
            else ClimbOut(
                from_step=c.from_step,
                from_bytes=c.from_bytes,
                to_step=c.to_step,
                to_bytes=c.to_bytes,
                per_step_bytes=c.per_step,
            ),
            steps_to_limit=p.steps_to_limit,
        )


class MemorySeriesOut(ApiModel):
    rank: int
    pool: str
    steps: list[int] = Field(description="each bucket's last step")
    used_bytes: list[float] = Field(description="each bucket's largest use")
    limit_bytes: float | None


class MemoryOut(ApiModel):
    """A run's memory per rank (seed 001 s6), least headroom first."""

    run_id: str
    pools: list[PoolOut]
    series: list[MemorySeriesOut] = Field(
        description="use over steps of the pools of least headroom (top), or of the rank asked"
    )

    @classmethod
    def of(cls, m: RunMemory) -> MemoryOut:
        return cls(
            run_id=m.run_id,
            pools=[PoolOut.of(p) for p in m.pools],
            series=[
                MemorySeriesOut(
                    rank=s.rank, pool=s.pool, steps=s.steps, used_bytes=s.used, limit_bytes=s.limit
                )
                for s in m.series
            ],
        )
