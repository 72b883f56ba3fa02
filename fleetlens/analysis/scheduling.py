"""Scheduling goodput of a pool from its scheduler records: complete allocations over in-service.

    scheduling goodput = sum_jobs gpus x |[gang_complete, end] ∩ window|  /  in-service GPU-time

Partial gangs (allocation start .. gang complete, every requested GPU counted as held: an upper
bound when the scheduler binds members one by one) and idle capacity are the scheduling loss.
The idle part is split by whether anything was queued at the time: capacity idle while jobs
waited is *stranded* (fragmentation, quotas, placement: a policy problem); idle with an empty
queue is *no demand* (a capacity-planning problem). Out-of-service capacity is not in the
denominator; it is reported beside it as availability.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["PoolCapacity", "SchedulingResult", "scheduling_goodput"]

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class PoolCapacity:
    """Installed and in-service GPUs over time: a step function starting at ``time[0]``."""

    time: F64
    capacity: F64
    in_service: F64

    @classmethod
    def constant(cls, capacity: float, in_service: float | None = None) -> PoolCapacity:
        return cls(
            np.array([-math.inf]),
            np.array([float(capacity)]),
            np.array([float(capacity if in_service is None else in_service)]),
        )

    def integral(self, values: F64, t0: float, t1: float) -> float:
        edges = np.clip(np.r_[self.time, math.inf], t0, t1)
        return float(np.sum(values * np.diff(edges)))


@dataclass(frozen=True)
class SchedulingResult:
    t0: float
    t1: float
    installed_gpu_s: float
    in_service_gpu_s: float
    complete_gpu_s: float
    partial_gpu_s: float
    stranded_gpu_s: float
    no_demand_gpu_s: float
    oversubscribed_gpu_s: float
    queue_wait_s: dict[str, float]
    jobs: int
    started: int
    pending: int

    @property
    def scheduling_goodput(self) -> float:
        if self.in_service_gpu_s <= 0:
            return 0.0
        return min(1.0, self.complete_gpu_s / self.in_service_gpu_s)

    @property
    def availability(self) -> float:
        return self.in_service_gpu_s / self.installed_gpu_s if self.installed_gpu_s > 0 else 0.0


def _overlap(a: F64, b: F64, t0: float, t1: float) -> F64:
    return np.asarray(np.maximum(np.minimum(b, t1) - np.maximum(a, t0), 0.0), dtype=np.float64)


def _step_integral(times: F64, deltas: F64, t0: float, t1: float) -> tuple[F64, F64]:
    """Sorted change points and the level after each, clipped to the window."""
    order = np.argsort(times, kind="stable")
    t, level = times[order], np.cumsum(deltas[order])
    return t, level


def scheduling_goodput(
    gpus: F64,
    submit: F64,
    start: F64,
    gang_complete: F64,
    end: F64,
    pool: PoolCapacity,
    window: tuple[float, float] | None = None,
) -> SchedulingResult:
    """The pool's scheduling goodput, idle split, availability and queue waits over ``window``.

    NaN ``gang_complete`` means the scheduler did not record one: it is taken as ``start`` (a
    rigid gang placed atomically). NaN ``start`` means never scheduled; NaN ``end`` means still
    held at the end of the window.
    """
    gpus = np.asarray(gpus, np.float64)
    submit = np.asarray(submit, np.float64)
    start = np.asarray(start, np.float64)
    gc = np.asarray(gang_complete, np.float64)
    gc = np.where(np.isnan(gc), start, gc)
    end = np.asarray(end, np.float64)
    if window is None:
        lo = float(np.nanmin(submit)) if len(submit) else 0.0
        hi = float(np.nanmax(np.r_[end, start, submit])) if len(submit) else 0.0
        window = (lo, hi)
    t0, t1 = window
    end_f = np.where(np.isnan(end), t1, end)
    ok = ~np.isnan(start)
    complete = float(np.sum(gpus[ok] * _overlap(gc[ok], end_f[ok], t0, t1)))
    partial = float(np.sum(gpus[ok] * _overlap(start[ok], np.minimum(gc, end_f)[ok], t0, t1)))
    installed = pool.integral(pool.capacity, t0, t1)
    in_service = pool.integral(pool.in_service, t0, t1)

    # Held GPUs and queued jobs over time, as step functions, to split idle capacity.
    held_t = np.r_[start[ok], end_f[ok]]
    held_d = np.r_[gpus[ok], -gpus[ok]]
    q_end = np.where(ok, start, t1)
    q_t = np.r_[submit, q_end]
    q_d = np.r_[np.ones(len(submit)), -np.ones(len(submit))]
    cap_t = pool.time
    grid = np.unique(np.clip(np.r_[held_t, q_t, cap_t[np.isfinite(cap_t)], t0, t1], t0, t1))
    stranded = no_demand = over = 0.0
    if len(grid) > 1:
        mid = (grid[:-1] + grid[1:]) / 2
        dt = np.diff(grid)
        ht, hl = _step_integral(held_t, held_d, t0, t1)
        held = np.r_[0.0, hl][np.searchsorted(ht, mid, side="right")]
        qt, ql = _step_integral(q_t, q_d, t0, t1)
        queued = np.r_[0.0, ql][np.searchsorted(qt, mid, side="right")]
        k = np.searchsorted(pool.time, mid, side="right") - 1
        cap = np.where(k >= 0, pool.in_service[np.maximum(k, 0)], 0.0)
        idle = cap - held
        stranded = float(np.sum(np.maximum(idle, 0) * dt * (queued > 0.5)))
        no_demand = float(np.sum(np.maximum(idle, 0) * dt * (queued <= 0.5)))
        over = float(np.sum(np.maximum(-idle, 0) * dt))
    waits = (start - submit)[ok & (submit >= t0) & (submit <= t1)]
    pending_mask = ~ok & (submit <= t1)
    qw: dict[str, float] = {}
    if len(waits):
        qw = {
            "mean": float(np.mean(waits)),
            "p50": float(np.percentile(waits, 50)),
            "p90": float(np.percentile(waits, 90)),
            "p99": float(np.percentile(waits, 99)),
            "max": float(np.max(waits)),
        }
    return SchedulingResult(
        t0=t0,
        t1=t1,
        installed_gpu_s=installed,
        in_service_gpu_s=in_service,
        complete_gpu_s=complete,
        partial_gpu_s=partial,
        stranded_gpu_s=stranded,
        no_demand_gpu_s=no_demand,
        oversubscribed_gpu_s=over,
        queue_wait_s=qw,
        jobs=len(gpus),
        started=int(np.sum(ok)),
        pending=int(np.sum(pending_mask)),
    )
