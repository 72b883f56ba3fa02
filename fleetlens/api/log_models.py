"""The JSON of a run's log lines (:mod:`fleetlens.api.logs`), built from
:mod:`fleetlens.services.logs`'s values."""

from __future__ import annotations

from pydantic import Field

from ..services.logs import LogLines
from .models import ApiModel

__all__ = ["LogLineOut", "LogsOut"]


class LogLineOut(ApiModel):
    time: float = Field(description="UNIX seconds, the rank's clock")
    rank: int
    step: int = Field(description="the step the rank was in, or had last finished; -1 before")
    level: str = Field(description="the logging record's; INFO for stdout, ERROR for stderr")
    source: str = Field(description="the logger's name, or stdout or stderr")
    message: str
    job_id: str = Field(description="the attempt (a restart is a new one)")


class LogsOut(ApiModel):
    """A run's log lines that matched, oldest first (seed 001 s57)."""

    run_id: str
    from_step: int
    to_step: int
    lines: list[LogLineOut]
    truncated: bool = Field(description="more lines matched than the limit")

    @classmethod
    def of(cls, got: LogLines) -> LogsOut:
        return cls(
            run_id=got.run_id,
            from_step=got.from_step,
            to_step=got.to_step,
            lines=[
                LogLineOut(
                    time=x.time,
                    rank=x.rank,
                    step=x.step,
                    level=x.level,
                    source=x.source,
                    message=x.message,
                    job_id=x.job_id,
                )
                for x in got.lines
            ],
            truncated=got.truncated,
        )
