"""An imported training run (from a log file) and its wire batches.

The importers (Megatron, Lightning, Hugging Face Trainer) parse a file into an
:class:`ImportedRun`: per job attempt, step rows (one rank standing for the job: logs report the
job's iteration time, not each rank's), scalars and lifecycle events. :func:`batches` turns it
into one wire batch per attempt and table, with stable batch ids, so importing a file twice
stores it once. The server does the rest: the run, its jobs and its config are registered from
the batches as they would be from the SDK, so goodput and anomalies are computed retroactively.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from ..lifecycle import ATTEMPT_ENDS
from ..wire import Table, TableBuilder, encode_batch

__all__ = ["Attempt", "ImportedRun", "LogEvent", "RunLogSummary", "batches"]

_MAX_ROWS = 200_000
# What ends an attempt for the analysis (its hang check runs to the last of these, not to now).


class SlowPeriod(msgspec.Struct, frozen=True, rename="camel"):
    """A slow period as the import reports it (the summary's ``slowPeriods``, a ``custom``
    event's ``attrs.slow_period``): its steps, its median interval and the run's."""

    from_step: int
    to_step: int
    points: int
    median_seconds: float
    run_median_seconds: float
    slowdown: float
    """The period's median interval over the run's."""


@dataclass
class Attempt:
    """One job attempt of an imported run (a restart in the log starts a new one)."""

    job_id: str
    start: float  # UNIX seconds
    steps: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # step start
    durations: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    scalars: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)  # time, kind, step, message, attrs
    # Steps at which the log reported (each ends an interval whose steps share its mean time);
    # empty: every step was reported on its own or the importer does not say.
    reported: set[int] = field(default_factory=set)

    def scalar(self, name: str, step: int, value: float) -> None:
        s, v = self.scalars.setdefault(name, ([], []))
        s.append(step)
        v.append(value)

    def event(
        self, time: float, kind: str, step: int = -1, message: str = "", **attrs: Any
    ) -> None:
        self.events.append(
            {"time": time, "kind": kind, "step": step, "message": message, "attrs": attrs}
        )

    def time_at(self, step: int) -> float:
        """Start time of ``step`` (or the attempt's start if it has no step rows yet)."""
        return float(self.times_at([step])[0])

    def times_at(self, steps: Sequence[int]) -> np.ndarray:
        """:meth:`time_at` of each of ``steps``, in one pass: the first step row at or after
        each, or the end of the last one past them."""
        if not self.steps:
            return np.full(len(steps), self.start, dtype=np.float64)
        i = np.searchsorted(np.asarray(self.steps), np.asarray(steps, dtype=np.int64))
        times = np.append(
            np.asarray(self.times, dtype=np.float64), self.times[-1] + self.durations[-1]
        )
        return times[i]


@dataclass
class ImportedRun:
    source: str  # megatron, megatron-golden, lightning, hf-trainer
    path: str
    config: dict[str, Any] = field(default_factory=dict)
    launch_command: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    clock: str = "log"  # "log": times from the log; "synthetic": from --start and step times
    notes: list[str] = field(default_factory=list)
    world_size: int = 0  # the job's ranks, from the log's arguments (0: not stated)
    # What episodes.settle read out of the numbers: non-finite values by metric, the start-up
    # time taken out of slow first iterations, the slow periods.
    nonfinite: dict[str, int] = field(default_factory=dict)
    startup_seconds: float = 0.0
    slow_periods: list[SlowPeriod] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return sum(len(a.steps) for a in self.attempts)

    def summary(self) -> RunLogSummary:
        durs = np.asarray([d for a in self.attempts for d in a.durations], dtype=np.float64)
        return RunLogSummary(
            source=self.source,
            file=self.path,
            attempts=[a.job_id for a in self.attempts],
            steps=self.steps,
            from_step=min((a.steps[0] for a in self.attempts if a.steps), default=None),
            to_step=max((a.steps[-1] for a in self.attempts if a.steps), default=None),
            median_step_seconds=float(np.median(durs)) if len(durs) else None,
            scalars=sorted({n for a in self.attempts for n in a.scalars}),
            events=[
                LogEvent(a.job_id, e["kind"], e["step"], e["message"])
                for a in self.attempts
                for e in a.events
                if e["kind"] not in ("job_start",)
            ],
            clock=self.clock,
            world_size=self.world_size or None,
            non_finite=dict(self.nonfinite),
            restarts=sum(1 for a in self.attempts for e in a.events if e["kind"] == "restart"),
            startup_seconds=self.startup_seconds,
            slow_periods=self.slow_periods,
            notes=self.notes,
        )


class LogEvent(msgspec.Struct, frozen=True, rename="camel"):
    """An event the log told of (a restart, a NaN, the job's end), in the attempt it ended."""

    job_id: str
    kind: str
    step: int
    message: str


class RunLogSummary(msgspec.Struct, frozen=True, rename="camel"):
    """An imported log as ``fleetlens import`` prints it (camelCase keys with ``--json``): its
    attempts and steps (None without any), the median step, the events, the world size the
    log states (None: not stated), the non-finite values by metric, the start-up seconds taken
    out of slow first iterations, the slow periods; ``run_id``: the run it is stored as."""

    source: str
    file: str
    attempts: list[str]
    steps: int
    from_step: int | None
    to_step: int | None
    median_step_seconds: float | None
    scalars: list[str]
    events: list[LogEvent]
    clock: str
    world_size: int | None
    non_finite: dict[str, int]
    restarts: int
    startup_seconds: float
    slow_periods: list[SlowPeriod]
    notes: list[str]
    run_id: str | None = None


def _tables(a: Attempt, run: ImportedRun, first: bool, last: bool) -> list[dict[str, Table]]:
    out: list[dict[str, Table]] = []
    n = len(a.steps)
    for lo in range(0, n, _MAX_ROWS):
        hi = min(n, lo + _MAX_ROWS)
        st = TableBuilder("step")
        st.add_packed("step", np.asarray(a.steps[lo:hi], dtype="<i8").tobytes())
        st.add_packed("rank", np.zeros(hi - lo, dtype="<i4").tobytes())
        st.add_packed("time", np.asarray(a.times[lo:hi], dtype="<f8").tobytes())
        st.add_packed("duration", np.asarray(a.durations[lo:hi], dtype="<f8").tobytes())
        st.add_packed("tokens", np.asarray(a.tokens[lo:hi], dtype="<i8").tobytes())
        out.append({"step": st.build()})
    names, steps, values = [], [], []
    for name, (s, v) in a.scalars.items():
        names += [name] * len(s)
        steps += s
        values += v
    for lo in range(0, len(steps), _MAX_ROWS):
        hi = min(len(steps), lo + _MAX_ROWS)
        sc = TableBuilder("scalar")
        sc.add_packed("step", np.asarray(steps[lo:hi], dtype="<i8").tobytes())
        sc.add_packed("time", a.times_at(steps[lo:hi]).astype("<f8").tobytes())
        sc.add("name", names[lo:hi])
        sc.add_packed("value", np.asarray(values[lo:hi], dtype="<f8").tobytes())
        out.append({"scalar": sc.build()})
    events = list(a.events)
    if last and a.steps and not any(e["kind"] in ATTEMPT_ENDS for e in events):
        # A log is history: it ends where the file ends. Without this the run would look live
        # and hung from its last line until now, and stay STALLED.
        events.append(
            {
                "time": a.times[-1] + a.durations[-1],
                "kind": "finish",
                "step": a.steps[-1],
                "message": "the imported log ends here",
                "attrs": {"inferred": "end of log"},
            }
        )
    for e in events:
        if e["kind"] == "job_start":
            e["attrs"] = {
                **e["attrs"],
                "config": run.config,
                "launch_command": run.launch_command,
                "imported_from": run.source,
            }
            if run.world_size:
                e["attrs"]["world_size"] = run.world_size  # as the SDK's job_start states it
    if events:
        ev = TableBuilder("event")
        ev.add("time", [e["time"] for e in events]).add("kind", [e["kind"] for e in events])
        ev.add("step", [int(e["step"]) for e in events])
        ev.add("message", [e["message"] for e in events])
        ev.add("attrs", [json.dumps(e["attrs"], default=str) for e in events])
        out.append({"event": ev.build()})
    return out


def batches(run: ImportedRun, run_id: str, project: str = "") -> list[tuple[str, bytes]]:
    """Wire batches (id, gzip body) of the run: every attempt's events, then the steps and
    scalars."""
    out: list[tuple[str, bytes]] = []
    events: list[tuple[str, bytes]] = []
    for k, a in enumerate(run.attempts):
        ctx = {"run_id": run_id, "job_id": a.job_id}
        if project:
            ctx["project"] = project
        for i, tables in enumerate(_tables(a, run, k == 0, k == len(run.attempts) - 1)):
            key = f"{run_id}\0{a.job_id}\0{run.path}\0{run.source}\0{i}"
            digest = hashlib.sha256(key.encode()).hexdigest()[:32]
            # Every attempt's events (its start and end) go first: an analysis pass that runs
            # between two of these batches already knows where each attempt ends, and never
            # calls the history in the log a live job that stopped (their times are the log's,
            # so the registry's status is not misled by the order).
            (events if "event" in tables else out).append(
                encode_batch(
                    tables,
                    ctx,
                    batch_id=f"import-{digest}",
                    source=f"fleetlens-import/{run.source}",
                    compress=True,
                )
            )
    return events + out
