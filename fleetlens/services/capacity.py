"""The planner's view of a period: where the fleet's GPU-hours went, bucket by bucket.

A run counts for the part of a bucket it held its GPUs (:func:`held`): from its first record
to its last, or to the bucket's end while it is hung (no step shows a hang, its GPUs stay
held). Each run's steps and events are read once for the period and broken down per bucket in
memory (:func:`fleetlens.analysis.breakdown.breakdown`), so a series costs a read per run, not
per run and bucket. Useful GPU-hours are the held ones times the runtime factor of the bucket
and the program factor of the run over the period (MFU needs the run's FLOPs over its retained
steps, which one bucket may not hold). In-service GPU-hours are the pools' capacity records,
between a pool's first record and its last (as the period's totals have them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..analysis.breakdown import Event, StepArrays
from ..store.metadata import MetadataStore, RunInfo
from ..store.scope import Scope
from .goodput import GoodputQueries, program_spec

__all__ = [
    "BUCKETS_MAX",
    "COHORTS",
    "CohortFigures",
    "FleetBucket",
    "FleetSeries",
    "JobTally",
    "buckets",
    "held",
    "pool_runs",
]

BUCKETS_MAX = 120
"""Buckets a series has at most (hours up to two days, then days, then wider)."""


def held(run: RunInfo, t0: float, t1: float) -> tuple[tuple[float, float], bool]:
    """The window to break ``run`` down over for ``[t0, t1]`` and whether it is cut to the
    run's own span (``held_only``): always, but for a hung run, whose GPUs stay held up to
    ``t1`` after its last step."""
    if run.status == "HUNG":
        start = max(t0, run.first_seen)
        return (start, max(t1, start)), False
    return (t0, t1), True


def pool_runs(
    gq: GoodputQueries, metadata: MetadataStore, scope: Scope, pool: str, runs: list[RunInfo]
) -> list[RunInfo]:
    """The runs of ``runs`` that ran in ``pool``: an allocation of the pool names the run, or
    the scheduler job id of one of its job attempts (the SDK's job id under Slurm)."""
    run_ids, job_ids = gq.pool_jobs(pool)
    return [
        r
        for r in runs
        if r.run_id in run_ids or any(j.job_id in job_ids for j in metadata.jobs(scope, r.run_id))
    ]


def buckets(t0: float, t1: float) -> list[tuple[float, float]]:
    """Consecutive windows covering ``[t0, t1]``: whole UTC hours for up to two days, whole
    days beyond, wider past :data:`BUCKETS_MAX` days; the first and last cut to the period."""
    span = max(0.0, t1 - t0)
    width = 3600.0 if span <= 48 * 3600.0 else 86400.0
    while math.ceil(span / width) > BUCKETS_MAX:
        width *= 2
    edge = math.floor(t0 / width) * width
    out = []
    while edge < t1:
        a, b = max(t0, edge), min(t1, edge + width)
        if b > a:
            out.append((a, b))
        edge += width
    return out


@dataclass
class FleetBucket:
    """One bucket's GPU-hours: in service, held by runs, useful, lost by cause."""

    start: float
    end: float
    in_service: float | None = None
    held: float = 0.0
    useful: float = 0.0
    lost: dict[str, float] = field(default_factory=dict)

    @property
    def base(self) -> float:
        """The GPU-hours the shares are of: in service, never less than what runs held."""
        return max(self.in_service or 0.0, self.held)

    @property
    def utilization(self) -> float | None:
        return self.held / self.base if self.base else None

    @property
    def goodput(self) -> float | None:
        return self.useful / self.base if self.base else None

    @property
    def loss_by_cause(self) -> dict[str, float]:
        return {k: v for k, v in self.lost.items() if v > 0}

    def cost_per_useful_gpu_hour(self, price: float) -> float | None:
        return price * self.base / self.useful if self.useful > 0 else None

    @property
    def spare_gpus(self) -> float | None:
        """GPUs in service that no run held, on average over the bucket: the spare pool."""
        if self.in_service is None or self.end <= self.start:
            return None
        return max(0.0, self.in_service - self.held) * 3600.0 / (self.end - self.start)


class FleetSeries:
    """The period bucket by bucket (:func:`buckets`): the pools' in-service GPU-hours, then
    each run's share added with its steps and events read once (:meth:`add_run`)."""

    def __init__(
        self,
        gq: GoodputQueries,
        pools: list[tuple[str, tuple[float, float]]],
        t0: float,
        t1: float,
    ) -> None:
        self.gq = gq
        self.buckets = [FleetBucket(a, b) for a, b in buckets(t0, t1)]
        for bucket in self.buckets:
            if not pools:
                continue
            bucket.in_service = 0.0
            for p, (lo, hi) in pools:  # a pool counts between its first and last record
                a, b = max(lo, bucket.start), min(hi, bucket.end)
                if b > a:
                    result = gq.pool_scheduling(p, a, b)
                    bucket.in_service += result.in_service_gpu_s / 3600.0

    def add_run(
        self,
        run: RunInfo,
        reads: tuple[tuple[StepArrays, dict[str, float]], list[Event]],
        window: tuple[float, float],
        held_only: bool,
        gpus: float,
        program: float,
    ) -> None:
        """Add the run's GPU-hours to the buckets its ``window`` overlaps: ``reads`` its step
        executions and events, ``program`` its program factor over the period."""
        executions, events = reads
        spec = program_spec(run.config or {})
        for bucket in self.buckets:
            lo, hi = max(window[0], bucket.start), min(window[1], bucket.end)
            if hi <= lo or not gpus:
                continue
            bd, f, _ = self.gq.run_goodput(
                run.run_id,
                spec,
                (lo, hi),
                executions=executions,
                events=events,
                held_only=held_only,
            )
            h = bd.held_s * gpus / 3600.0
            bucket.held += h
            bucket.useful += h * f.runtime * program
            for k, v in bd.seconds.items():
                if k != "productive":
                    bucket.lost[k] = bucket.lost.get(k, 0.0) + v * gpus / 3600.0


COHORTS = ((1, 8, "1-8 GPUs"), (9, 64, "9-64 GPUs"), (65, 512, "65-512 GPUs"))
"""Job sizes the planner compares (a node, a few racks, more); beyond: 513+ GPUs."""


def cohort(gpus: float) -> str:
    for lo, hi, name in COHORTS:
        if lo <= gpus <= hi:
            return name
    return "513+ GPUs" if gpus > 512 else "unknown size"


@dataclass(frozen=True, slots=True)
class CohortFigures:
    """The runs of one size (:data:`COHORTS`) and their GPU-hours."""

    size: str
    runs: int
    held_gpu_hours: float
    useful_gpu_hours: float
    goodput: float | None


@dataclass
class JobTally:
    """The period's jobs as the planner weighs them: how they ended (a success rate over the
    runs that ended) and their GPU-hours by size (the many-short-jobs view)."""

    status: dict[str, int] = field(default_factory=dict)
    cohorts: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, run: RunInfo, gpus: float, held_h: float, useful_h: float) -> None:
        self.status[run.status] = self.status.get(run.status, 0) + 1
        c = self.cohorts.setdefault(cohort(gpus), {"runs": 0, "held": 0.0, "useful": 0.0})
        c["runs"] += 1
        c["held"] += held_h
        c["useful"] += useful_h

    @property
    def by_status(self) -> dict[str, int]:
        return dict(sorted(self.status.items()))

    @property
    def ended(self) -> int:
        """Runs that ended: finished, failed or stopped."""
        return sum(self.status.get(k, 0) for k in ("FINISHED", "FAILED", "STOPPED"))

    @property
    def success_rate(self) -> float | None:
        ended = self.ended
        return self.status.get("FINISHED", 0) / ended if ended else None

    def cohort_figures(self) -> list[CohortFigures]:
        """The sizes that had runs, smallest first."""
        order = [name for _, _, name in COHORTS] + ["513+ GPUs", "unknown size"]
        return [
            CohortFigures(
                size=name,
                runs=int(c["runs"]),
                held_gpu_hours=c["held"],
                useful_gpu_hours=c["useful"],
                goodput=c["useful"] / c["held"] if c["held"] > 0 else None,
            )
            for name in order
            if (c := self.cohorts.get(name)) is not None
        ]
