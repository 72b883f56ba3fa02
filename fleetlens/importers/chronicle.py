"""Replay a training run's logbook (a hand-built list of dated incidents) as a timeline.

The chronicle gives dates, step times, checkpoint and evaluation cadence, and for each incident
the hours it cost. The replay walks time forward one optimizer step at a time, inserts the
checkpoint and evaluation pauses, and at each incident emits what the run's own telemetry would
have recorded: a failure and a relaunch (with the lost steps re-executed under a new attempt),
a hang, a maintenance outage, or a stretch of slow steps (one slow rank). The result is plain
breakdown input: :class:`~fleetlens.analysis.breakdown.StepArrays` and events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.breakdown import Event, StepArrays
from ..errors import ConfigError

__all__ = ["Chronicle", "load_chronicle", "replay"]


def _ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class Chronicle:
    start: float
    end: float
    step_s: float
    checkpoint_every: int
    checkpoint_s: float
    eval_every: int
    eval_s: float
    incidents: list[dict[str, Any]]
    meta: dict[str, Any]


def load_chronicle(path: str | Path) -> Chronicle:
    d = json.loads(Path(path).read_text())
    run = d["run"]
    return Chronicle(
        start=_ts(run["start"]),
        end=_ts(run["end"]),
        step_s=float(run["step_s"]),
        checkpoint_every=int(run["checkpoint_every"]),
        checkpoint_s=float(run["checkpoint_s"]),
        eval_every=int(run["eval_every"]),
        eval_s=float(run["eval_s"]),
        incidents=sorted(d["incidents"], key=lambda i: _ts(i["time"])),
        meta=d,
    )


def replay(c: Chronicle) -> tuple[StepArrays, list[Event]]:
    rows: list[tuple[int, str, float, float, float, float]] = []
    events: list[Event] = []
    t, step, attempt = c.start, 0, 0
    job = "a0"
    events.append(Event(t, "job_start", job))
    slow: list[tuple[float, float, float]] = [
        (_ts(i["time"]), _ts(i["until"]), float(i["slowdown"]))
        for i in c.incidents
        if i["kind"] == "slowdown"
    ]

    def run_until(limit: float) -> None:
        nonlocal t, step
        while True:
            factor = next((s for a, b, s in slow if a <= t < b), 0.0)
            dur = c.step_s * (1.0 + factor)
            if t + dur > limit:
                return
            rows.append((step, job, t, t + dur, dur, c.step_s))
            t += dur
            step += 1
            if step % c.checkpoint_every == 0:
                events.append(Event(t, "checkpoint_begin", job, step))
                t += c.checkpoint_s
                events.append(Event(t, "checkpoint_end", job, step))
            if step % c.eval_every == 0:
                events.append(
                    Event(t, "custom", job, step, {"category": "evaluation", "duration": c.eval_s})
                )
                t += c.eval_s

    def relaunch(after: float) -> None:
        nonlocal t, attempt, job
        # Slurm requeues onto the same reservation: the relaunch is held time (recovery).
        attempt += 1
        job = f"a{attempt}"
        events.append(Event(t, "job_start", job))
        t = after

    for inc in c.incidents:
        kind = inc["kind"]
        if kind == "slowdown":
            continue
        run_until(_ts(inc["time"]))
        lost = float(inc.get("lost_h", 0.0)) * 3600.0
        restart = float(inc.get("restart_h", 0.0)) * 3600.0
        if kind == "crash":
            events.append(Event(t, "failure", job, step))
            step = max(0, step - round(lost / c.step_s))
            relaunch(t + restart)
        elif kind == "hang":
            events.append(Event(t, "hang", job, step, {"duration": lost}))
            t += lost
            events.append(Event(t, "failure", job, step))
            relaunch(t + restart)
        elif kind == "maintenance":
            events.append(Event(t, "maintenance", job, step, {"duration": lost}))
            t += lost
            relaunch(t + restart)
        else:
            raise ConfigError(f"incident kind {kind!r} is not crash, hang, maintenance, slowdown")
    run_until(c.end)
    events.append(Event(t, "finish", job, step))
    a = np.array([r[2:] for r in rows], dtype=np.float64).reshape(-1, 4)
    return (
        StepArrays(
            step=np.array([r[0] for r in rows], dtype=np.int64),
            job_id=np.array([r[1] for r in rows], dtype=object),
            start=a[:, 0],
            end=a[:, 1],
            max_compute=a[:, 2],
            mean_compute=a[:, 3],
        ),
        events,
    )
