"""Time to result across a project's runs, and their efficiency frontier (seed 003 s9.9.4).

Time to result is the wall-clock time from a run's first record (its submission, as far as
fleetlens saw it) until it reached a fixed target: a step (the project's most common target in
the runs' configs, :data:`fleetlens.services.runs.TARGET_KEYS`, unless one is given), or a
quality, the first logged ``loss`` at or under a value. A running run that has not reached a
step target yet is estimated from its recent wall-clock pace (:func:`completion`); a loss target
is never extrapolated. Its cost is the GPU-hours held to get there: the run's devices times its
time to result.

The frontier is the Pareto-optimal subset: a run is on it when no other run reached the same
target both sooner and for fewer GPU-hours. Runs that did not reach it (ended short, or running
with no estimate) are listed without a place on it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from ..errors import NotFound
from ..store.metadata import MetadataStore, RunInfo
from ..store.reader import TenantReader
from ..store.run_queries import RunTelemetryQueries
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore
from .runs import RunQueries, completion, step_target

__all__ = ["MAX_RUNS", "Frontier", "RunResult", "frontier"]

MAX_RUNS = 500
"""Runs of a project read at most (the most recently active)."""


@dataclass(frozen=True)
class RunResult:
    run_id: str
    status: str
    devices: int
    started: float  # UNIX seconds: the run's first record
    reached_at: float | None  # when it reached the target (estimated when ``estimated``)
    reached_step: int | None
    estimated: bool
    on_frontier: bool = False

    @property
    def seconds(self) -> float | None:
        return None if self.reached_at is None else max(0.0, self.reached_at - self.started)

    @property
    def gpu_hours(self) -> float | None:
        s = self.seconds
        return None if s is None else s * self.devices / 3600.0


@dataclass(frozen=True)
class Frontier:
    project: str
    target_steps: int | None
    target_loss: float | None
    runs: list[RunResult]  # fastest first; those that did not reach the target last


def _target(runs: list[RunInfo]) -> int | None:
    """The step target most of the runs name in their config (the largest of a tie)."""
    named = Counter(t[1] for r in runs if (t := step_target(r.config)) is not None)
    if not named:
        return None
    top = max(named.values())
    return max(v for v, n in named.items() if n == top)


def _pareto(results: list[RunResult]) -> list[RunResult]:
    """``results`` fastest first, each marked on the frontier when no faster run cost fewer
    GPU-hours (equal time: the cheaper alone)."""
    done = sorted(
        (r for r in results if r.seconds is not None),
        key=lambda r: (r.seconds or 0.0, r.gpu_hours or 0.0),
    )
    out: list[RunResult] = []
    cheapest = float("inf")
    for r in done:
        cost = r.gpu_hours or 0.0
        on = cost < cheapest
        cheapest = min(cheapest, cost)
        out.append(replace(r, on_frontier=on))
    return out + [r for r in results if r.seconds is None]


def frontier(
    metadata: MetadataStore,
    telemetry: TelemetryStore,
    scope: Scope,
    project: str,
    target_steps: int | None = None,
    target_loss: float | None = None,
) -> Frontier:
    """Every run of ``project`` (the :data:`MAX_RUNS` most recently active) with its time to
    the target and its GPU-hours, and the frontier among them; NotFound when the caller sees no
    run of it."""
    runs = metadata.list_runs(scope, project, MAX_RUNS, 0)
    if not runs:  # whether it exists elsewhere or not
        raise NotFound(f"project {project!r} has no run you can see")
    if target_loss is None and target_steps is None:
        target_steps = _target(runs)
    ids = [r.run_id for r in runs]
    q = RunTelemetryQueries(TenantReader(telemetry, scope))
    summaries = RunQueries(telemetry, scope)
    by_loss = q.reached_loss(ids, target_loss) if target_loss is not None and ids else {}
    by_step = q.reached_step(ids, target_steps - 1) if target_steps and ids else {}
    results = []
    for r in runs:
        at: float | None = None
        step: int | None = None
        estimated = False
        if target_loss is not None:
            if r.run_id in by_loss:
                step, at = by_loss[r.run_id]
        elif target_steps:
            if r.run_id in by_step:
                at, step = by_step[r.run_id], target_steps - 1
            elif r.status == "RUNNING":  # not there yet: at its recent pace
                summary = summaries.summary(r.run_id)
                eta = completion({"total_steps": target_steps}, summary, r.status)
                if eta is not None:
                    at, step, estimated = eta.finish_at, target_steps - 1, True
        results.append(
            RunResult(r.run_id, r.status, max(r.world_size, 1), r.first_seen, at, step, estimated)
        )
    return Frontier(project, target_steps, target_loss, _pareto(results))
