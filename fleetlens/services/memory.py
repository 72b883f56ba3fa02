"""A run's memory per rank (seed 001 s6): each rank's device and process memory, its peak, its
headroom and its climb (:mod:`fleetlens.analysis.memory`), least headroom first, and the use over
steps of the ranks closest to their limit. Read by ``GET /v1/runs/{run}/memory``, ``fleetlens
memory`` and the run page; the ``oom`` finding's climb is :func:`oom_climb`.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, replace

from ..analysis.evidence import Evidence
from ..analysis.memory import POOLS, Climb, PoolMemory, climb, pool_memory, steady
from ..analysis.rootcause import Diagnosis
from ..config import AnalyzerConfig
from ..store.memory_queries import MemoryQueries
from ..store.metadata import MetadataStore
from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore

__all__ = [
    "MAX_POINTS",
    "RankSeries",
    "RunMemory",
    "memory_climbs",
    "oom_climb",
    "run_memory",
    "with_oom_climbs",
]

log = logging.getLogger("fleetlens.memory")

MAX_POINTS = 500
CLIMB_POINTS = 60
"""Buckets of a rank's use the analyzer's climb is fitted over (each its largest value)."""

"""Points of a rank's series at most (buckets of steps, each its largest value)."""

_USE = sorted({n for uses, _, _ in POOLS.values() for n in uses})


@dataclass(frozen=True)
class RankSeries:
    rank: int
    pool: str
    steps: list[int]
    used: list[float]
    limit: float | None


@dataclass(frozen=True)
class RunMemory:
    run_id: str
    pools: list[PoolMemory]  # least headroom (as a share of the limit) first
    series: list[RankSeries]  # the ``top`` ranks' pools of least headroom, or the rank asked


def _share(p: PoolMemory) -> float:
    return p.headroom / p.limit if p.headroom is not None and p.limit else float("inf")


def _use_series(
    q: MemoryQueries, run_id: str, ranks: list[int] | None, lo: int, hi: int, points: int
) -> dict[tuple[int, str], tuple[list[int], list[float]]]:
    """(rank, use scalar) -> (steps, values) over ``lo..hi`` in at most ``points`` buckets."""
    width = max(1, -(-(hi - lo + 1) // max(points, 1)))
    out: dict[tuple[int, str], tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    for r in q.buckets(run_id, _USE, ranks, lo, hi, width).to_pylist():
        steps, values = out[(int(r["rank"]), r["name"])]
        steps.append(int(r["last"]))
        values.append(float(r["v"]))
    return out


def _pools(
    q: MemoryQueries, run_id: str, rank: int | None, points: int, window: int | None = None
) -> tuple[list[PoolMemory], dict[tuple[int, str], RankSeries]]:
    """Every rank's pools (or ``rank``'s), least headroom first, and each one's use over steps
    in at most ``points`` buckets (over the newest ``window`` steps when given)."""
    last: dict[int, dict[str, float]] = defaultdict(dict)
    peak: dict[int, dict[str, float]] = defaultdict(dict)
    lo, hi = 2**62, -1
    for r in q.totals(run_id).to_pylist():
        if rank is not None and r["rank"] != rank:
            continue
        last[r["rank"]][r["name"]] = float(r["last"])
        peak[r["rank"]][r["name"]] = float(r["peak"])
        lo, hi = min(lo, int(r["lo"])), max(hi, int(r["hi"]))
    if hi < 0:
        return [], {}
    ranks = sorted(last)
    if window is not None:
        lo = max(lo, hi - window + 1)
    used = _use_series(q, run_id, ranks, lo, hi, min(points, MAX_POINTS))
    pools: list[PoolMemory] = []
    series: dict[tuple[int, str], RankSeries] = {}
    for rk in ranks:
        for pool, (uses, _, _) in POOLS.items():
            name = next((n for n in uses if n in last[rk]), None)
            if name is None:
                continue
            steps, values = used.get((rk, name), ([], []))
            p = pool_memory(rk, pool, last[rk], peak[rk], steps, values)
            if p is not None:
                pools.append(p)
                series[(rk, pool)] = RankSeries(rk, pool, steps, values, p.limit)
    pools.sort(key=lambda p: (_share(p), p.rank, p.pool))
    return pools, series


def run_memory(
    metadata: MetadataStore,
    telemetry: TelemetryStore,
    scope: Scope,
    run_id: str,
    rank: int | None = None,
    top: int = 8,
    points: int = 200,
) -> RunMemory:
    """The run's memory, every rank's pools and the series of ``top`` of them (or of ``rank``'s
    alone); NotFound unless the caller may see the run."""
    metadata.get_run(scope, run_id)
    pools, series = _pools(MemoryQueries(TenantReader(telemetry, scope)), run_id, rank, points)
    shown = pools if rank is not None else pools[: max(top, 0)]
    return RunMemory(run_id, pools, [series[(p.rank, p.pool)] for p in shown])


def memory_climbs(
    reader: TenantReader, run_id: str, cfg: AnalyzerConfig, last_step: int
) -> list[Diagnosis]:
    """A ``memory_climb`` finding for each rank whose memory climbs steadily towards its limit
    (the run will run out of memory at this pace): its climb is steady
    (:func:`fleetlens.analysis.memory.steady`), has risen by ``memory_min_rise`` of the limit and
    reaches the limit within ``memory_warn_steps`` steps. The ranks of one pool are one
    finding, extended to the run's ``last_step`` while a pass sees it: one no longer seen ends
    at the step the last pass that saw it had reached."""
    # The newest steps only: a leak that began late in a long run is fitted on its own.
    window = int(2 * cfg.memory_warn_steps)
    pools, series = _pools(MemoryQueries(reader), run_id, None, CLIMB_POINTS, window)
    by_pool: dict[str, list[PoolMemory]] = defaultdict(list)
    for p in pools:
        c = p.climb
        if c is None or p.steps_to_limit is None or not p.limit or c.per_step is None:
            continue
        used = series[(p.rank, p.pool)]
        rose = (c.to_bytes - c.from_bytes) / p.limit
        near = p.steps_to_limit <= cfg.memory_warn_steps
        if rose >= cfg.memory_min_rise and near and steady(used.steps, used.used):
            by_pool[p.pool].append(p)
    out = []
    for pool, climbing in by_pool.items():
        first = min(climbing, key=lambda p: p.steps_to_limit or 0.0)  # the nearest its limit
        c = first.climb
        assert c is not None and first.steps_to_limit is not None
        what = "device memory" if pool == "device" else "process memory"
        ranks = sorted(p.rank for p in climbing)
        who = (
            f"rank {ranks[0]}"
            if len(ranks) == 1
            else f"{len(ranks)} ranks (first rank {first.rank})"
        )
        summary = (
            f"{what} of {who} climbs to its limit: {c.text(first.limit)}; at this pace it runs "
            f"out in about {first.steps_to_limit:,.0f} steps"
        )
        evidence: list[Evidence] = [
            {
                "signal": "memory_climb",
                "rank": p.rank,
                "from_step": p.climb.from_step if p.climb else None,
                "to_step": p.climb.to_step if p.climb else None,
                "used_bytes": p.used,
                "limit_bytes": p.limit,
                "per_step_bytes": p.climb.per_step if p.climb else None,
                "steps_to_limit": p.steps_to_limit,
            }
            for p in climbing[:16]
        ]
        out.append(
            Diagnosis(
                f"memory_climb:{pool}",
                "memory_climb",
                "event",
                0.8,
                summary,
                c.to_step,
                c.from_step,
                max(c.to_step, last_step),
                ranks=ranks,
                evidence=evidence,
            )
        )
    return out


def oom_climb(
    q: MemoryQueries, run_id: str, rank: int, step: int, device: str
) -> tuple[Climb, float | None] | None:
    """The climb of ``rank``'s memory up to its out-of-memory error at ``step`` and the pool's
    limit: the process's pool for a ``cpu`` error, else the device's when the rank sent one and
    the process's otherwise; None when the rank sent no memory samples."""
    # A device's error (its message does not always name the device: older torch writes
    # "(GPU 0; 15.78 GiB total capacity ...)") is the device's pool when the rank sent one.
    pools = ["host"] if device == "cpu" else ["device", "host"]
    for pool in pools:
        got = _climb_of(q, run_id, rank, step, pool)
        if got is not None:
            return got
    return None


def _climb_of(
    q: MemoryQueries, run_id: str, rank: int, step: int, pool: str
) -> tuple[Climb, float | None] | None:
    uses, _, limit_name = POOLS[pool]
    width = max(1, -(-(step + 1) // MAX_POINTS))
    got = q.buckets(run_id, [*uses, limit_name], [rank], 0, step, width).to_pylist()
    by: dict[str, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    for r in got:
        by[r["name"]][0].append(int(r["last"]))
        by[r["name"]][1].append(float(r["v"]))
    name = next((n for n in uses if n in by), None)
    if name is None:
        return None
    c = climb(*by[name])
    limits = by.get(limit_name, ([], []))[1]
    return (c, limits[-1] if limits else None) if c is not None else None


def with_oom_climbs(reader: TenantReader, run_id: str, found: list[Diagnosis]) -> list[Diagnosis]:
    """``found`` with each ``oom`` finding's memory climb up to it (seed 001 s6): its summary
    says it, and its evidence gains the pool's use over the steps before it."""
    q = MemoryQueries(reader)
    out = []
    for d in found:
        ev = d.evidence[0] if d.diagnosis == "oom" and d.evidence and d.ranks else None
        got = None
        try:
            if ev is not None:
                got = oom_climb(q, run_id, d.ranks[0], d.step, str(ev.get("device") or ""))
        except Exception:  # the finding stands without its climb; the next pass tries again
            log.exception("the memory climb of %s in run %s", d.key, run_id)
        if got is None:
            out.append(d)
            continue
        c, limit = got
        memory: Evidence = {
            "signal": "memory_climb",
            "from_step": c.from_step,
            "from_bytes": c.from_bytes,
            "to_step": c.to_step,
            "to_bytes": c.to_bytes,
            "per_step_bytes": c.per_step,
            "limit_bytes": limit,
        }
        out.append(
            replace(d, summary=f"{d.summary}; {c.text(limit)}", evidence=[*d.evidence, memory])
        )
    return out
