"""A run's log lines by step (seed 001 s57): searched by text, rank, steps and level, and the
lines around a step (a finding's). Read by ``GET /v1/runs/{run}/logs``, ``fleetlens logs`` and
the run page; the lines come from the SDK (``FLEETLENS_LOGS=1``, :mod:`fleetlens.sdk.logs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schema import LOG_LEVELS
from ..store.log_queries import LogQueries
from ..store.metadata import MetadataStore
from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore

__all__ = ["AROUND_STEPS", "MAX_LINES", "LogLine", "LogLines", "LogSearch", "search_logs"]

MAX_LINES = 5000
"""Lines of one answer at most."""

AROUND_STEPS = 2
"""The lines around step S are those of steps S - 2 .. S + 2."""


@dataclass(frozen=True)
class LogSearch:
    text: str = ""
    rank: int | None = None
    from_step: int = -1
    to_step: int = 2**62
    around: int | None = None  # a step: the lines of AROUND_STEPS either side, replacing the range
    level: str | None = None  # this level and the ones above it
    limit: int = 500

    def steps(self) -> tuple[int, int]:
        if self.around is not None:
            return max(-1, self.around - AROUND_STEPS), self.around + AROUND_STEPS
        return self.from_step, self.to_step

    def levels(self) -> list[str] | None:
        if self.level is None:
            return None
        return list(LOG_LEVELS[LOG_LEVELS.index(self.level) :])


@dataclass(frozen=True)
class LogLine:
    time: float
    rank: int
    step: int
    level: str
    source: str
    message: str
    job_id: str


@dataclass(frozen=True)
class LogLines:
    run_id: str
    from_step: int
    to_step: int
    lines: list[LogLine]
    truncated: bool  # more lines matched than the limit


def search_logs(
    metadata: MetadataStore, telemetry: TelemetryStore, scope: Scope, run_id: str, s: LogSearch
) -> LogLines:
    """The run's lines that match ``s``, oldest first; NotFound unless the caller may see the
    run."""
    metadata.get_run(scope, run_id)
    lo, hi = s.steps()
    limit = max(1, min(s.limit, MAX_LINES))
    ranks = None if s.rank is None else [s.rank]
    q = LogQueries(TenantReader(telemetry, scope))
    rows = q.search(run_id, s.text, ranks, lo, hi, s.levels(), limit + 1).to_pylist()
    lines = [
        LogLine(
            float(r["time"]),
            int(r["rank"]),
            int(r["step"]),
            str(r["level"]),
            str(r["source"]),
            str(r["message"]),
            str(r["job_id"]),
        )
        for r in rows[:limit]
    ]
    return LogLines(run_id, lo, hi, lines, len(rows) > limit)
