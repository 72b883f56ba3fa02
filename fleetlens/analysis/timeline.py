"""A run's timeline as the goodput breakdown reads it: step executions and lifecycle events.

Plain inputs, no I/O: the store's ``steps_by_step`` rollup becomes :class:`StepArrays`, its event
rows become :class:`Event`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError

__all__ = [
    "F64",
    "Event",
    "StepArrays",
    "checkpoint_saves",
    "checkpoint_seconds",
    "events_from_rows",
    "save_pauses",
]

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Event:
    time: float
    kind: str
    job_id: str = ""
    step: int = -1
    attrs: Mapping[str, Any] = field(default_factory=dict)
    rank: int = -1

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Event:
        attrs = row.get("attrs") or {}
        if isinstance(attrs, str):
            try:
                attrs = json.loads(attrs) if attrs else {}
            except ValueError:
                attrs = {}
        return cls(
            float(row["time"]),
            str(row["kind"]),
            str(row.get("job_id") or ""),
            int(row.get("step", -1)),
            attrs if isinstance(attrs, dict) else {},
            int(row.get("rank", -1)),
        )


@dataclass(frozen=True)
class StepArrays:
    """One row per step execution (step x job attempt), as the ``steps_by_step`` rollup has it."""

    step: npt.NDArray[np.int64]
    job_id: npt.NDArray[Any]
    start: F64
    end: F64
    max_compute: F64
    mean_compute: F64
    data_wait: F64 | None = None

    def __post_init__(self) -> None:
        n = len(self.step)
        for name in ("job_id", "start", "end", "max_compute", "mean_compute"):
            if len(getattr(self, name)) != n:
                raise ConfigError(f"StepArrays.{name} has {len(getattr(self, name))} rows, not {n}")
        if self.data_wait is not None and len(self.data_wait) != n:
            raise ConfigError("StepArrays.data_wait must have one value per step execution")

    @classmethod
    def empty(cls) -> StepArrays:
        z = np.zeros(0)
        return cls(np.zeros(0, np.int64), np.zeros(0, object), z, z, z, z)


def events_from_rows(rows: Sequence[Mapping[str, Any]]) -> list[Event]:
    return [Event.from_row(r) for r in rows]


def checkpoint_seconds(attrs: Mapping[str, Any]) -> float | None:
    """How long a ``checkpoint_end``'s save took, in seconds: ``duration_s`` (what the SDK and
    the simulator write), else ``duration`` (what the log importers wrote before); None when
    neither is a finite number >= 0."""
    for key in ("duration_s", "duration"):
        v = attrs.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
            return float(v)
    return None


def checkpoint_saves(events: Iterable[Event]) -> list[list[Event]]:
    """The ``checkpoint_end`` reports of each save, in the order the saves ended.

    Every rank of a job reports the same save, so a rank's k-th report of a (job, step) and the
    other ranks' k-th are one save; one rank's reports are each a save of their own (a decorated
    save function reports the same step every time, a save with no step reports -1)."""
    times: dict[tuple[str, int, int], int] = {}
    saves: dict[tuple[str, int, int], list[Event]] = {}
    for e in events:
        if e.kind != "checkpoint_end":
            continue
        k = times.get((e.job_id, e.step, e.rank), 0)
        times[(e.job_id, e.step, e.rank)] = k + 1
        saves.setdefault((e.job_id, e.step, k), []).append(e)
    return sorted(saves.values(), key=lambda reports: max(r.time for r in reports))


def save_pauses(events: Iterable[Event]) -> tuple[list[int], list[float], list[float]]:
    """Each synchronous save that succeeded: its step, its pause and when it ended, in order.
    A save every rank reports pauses the job for its slowest rank's (the others wait at the next
    collective); a background save (``sync`` false) is no pause and a failed one no save."""
    steps, pauses, times = [], [], []
    for reports in checkpoint_saves(events):
        took = [
            t
            for r in reports
            if r.attrs.get("sync", True) is not False and r.attrs.get("ok", True) is not False
            if (t := checkpoint_seconds(r.attrs)) is not None
        ]
        if took:
            steps.append(reports[0].step)
            pauses.append(max(took))
            times.append(max(r.time for r in reports))
    return steps, pauses, times
