"""Scheduler records in and out: parse one file, store its allocations and capacity, read them.

One file of one format (:data:`FORMATS`) is parsed whole before anything is stored, so a bad line
stores nothing; its allocations go to ``sched_alloc`` and its capacity to ``sched_pool``, the
tables the fleet's scheduling goodput reads (``GET /v1/fleet/goodput``). Both tables replace a row
imported again (same pool, submit and job), so importing a file twice changes nothing.

A run's scheduling factor (:func:`run_scheduling`) comes from its own allocations: those imported
with its run id, or whose job id is one the run carries (the run id itself, its job ids, the
``SLURM_JOB_ID`` its ranks saw, or a Kubernetes job named like the run). The run inherits the
scheduling goodput of the pool it drew from over the interval it held it (docs/goodput.md); a pool
whose capacity was never imported gives the run's own complete share: complete-gang GPU-time
over held GPU-time.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import time as _time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import pyarrow as pa

from ..analysis.scheduling import PoolCapacity, scheduling_goodput
from ..errors import ConfigError, FleetlensError, TraceFormatError
from ..importers import Allocations, PoolRows
from ..store.reader import TenantReader
from ..store.sched_queries import SchedQueries
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore
from .goodput import GoodputQueries

__all__ = [
    "FORMATS",
    "Allocation",
    "CapacityRecord",
    "FileSummary",
    "Parsed",
    "PoolScheduling",
    "RunScheduling",
    "allocation_records",
    "capacity",
    "import_records",
    "parse_records",
    "run_scheduling",
    "run_scheduling_factor",
]

FORMATS = ("sacct", "sinfo", "k8s", "alibaba")


@dataclass
class Parsed:
    format: str
    allocations: Allocations | None = None
    pools: PoolRows | None = None
    pods: dict[str, int] = field(default_factory=dict)
    pending_reasons: dict[str, str] = field(default_factory=dict)


def _bad_input(fmt: str, exc: FleetlensError) -> FleetlensError:
    """A parser's refusal as a 400 (the parsers raise the base class for a bad file)."""
    if isinstance(exc, (TraceFormatError, ConfigError)):
        return exc
    text = str(exc)
    return TraceFormatError(text if text.startswith(fmt) else f"{fmt}: {text}")


def _lines(data: str) -> Iterable[str]:
    return io.StringIO(data)


def parse_records(
    fmt: str,
    data: str,
    *,
    nodes: str | None = None,
    pool: str | None = None,
    run_id: str | None = None,
    tz: str = "UTC",
    epoch: float = 0.0,
    time: float | None = None,
) -> Parsed:
    """Parse one file's text; nothing is stored. ``run_id`` tags every allocation of it."""
    if fmt not in FORMATS:
        raise ConfigError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    if nodes is not None and fmt != "alibaba":
        raise ConfigError("`nodes` (a GPU node list) goes with the alibaba format only")
    if pool is not None and (fmt == "sinfo" or not pool.strip()):
        raise ConfigError(
            "`pool` names the pool of a k8s, alibaba or sacct file (non-empty); sinfo's pools are "
            "its partitions"
        )
    if not math.isfinite(epoch) or (time is not None and not math.isfinite(time)):
        raise ConfigError("`epoch` and `time` are finite UNIX seconds")
    out = Parsed(fmt)
    try:
        if fmt == "sacct":
            from ..importers.sacct import parse_sacct

            try:
                zone = ZoneInfo(tz)
            except (ZoneInfoNotFoundError, ValueError, OSError):
                raise ConfigError(
                    f"time zone {tz!r} is unknown; name it as the IANA database does "
                    "(UTC, Europe/Paris, America/Chicago)"
                ) from None
            out.allocations = parse_sacct(_lines(data), tz=zone)
        elif fmt == "sinfo":
            from ..importers.sinfo import parse_sinfo

            out.pools = parse_sinfo(_lines(data), _time.time() if time is None else time)
        elif fmt == "k8s":
            from ..importers.k8s import parse_k8s

            try:
                doc = json.loads(data)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(
                    f"k8s: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
                    "expected the output of kubectl get pods,events -o json"
                ) from None
            jobs = parse_k8s(doc, pool=pool or "k8s")
            out.allocations, out.pods, out.pending_reasons = (
                jobs.allocations,
                jobs.pods,
                jobs.pending_reasons,
            )
        else:
            from ..importers.alibaba import parse_nodes, parse_pods

            out.allocations = parse_pods(_lines(data), pool=pool or "openb", epoch=epoch)
            if nodes is not None:
                out.pools = parse_nodes(_lines(nodes), pool=pool or "openb", time=epoch)
    except FleetlensError as exc:
        raise _bad_input(fmt, exc) from exc
    except (
        LookupError,
        TypeError,
        AttributeError,
        ValueError,
        ArithmeticError,
        RecursionError,
        OSError,
    ) as exc:
        # A file the parsers' own checks let through (an object where a string belongs, a GPU
        # count past int32): still the file's fault, never the server's.
        raise TraceFormatError(f"{fmt}: the file is not shaped as expected ({exc!r})") from exc
    a = out.allocations
    if a is not None:
        k = len(a)
        if pool is not None:
            a = dataclasses.replace(a, pool=np.array([pool] * k, dtype=object))
        if run_id:
            a = dataclasses.replace(a, run_id=np.array([run_id] * k, dtype=object))
        out.allocations = a
    return out


@dataclass(frozen=True, slots=True)
class CapacityRecord:
    """A pool's GPUs at a time: installed (``capacity_gpus``) and in service."""

    pool: str
    time: float
    capacity_gpus: int
    in_service_gpus: int


@dataclass(frozen=True, slots=True)
class FileSummary:
    """What a scheduler file held; None: the file had none of it (an absent key)."""

    format: str
    stored: bool
    allocations: int
    capacity: list[CapacityRecord]
    started: int | None = None
    pending: int | None = None
    gpus: int | None = None
    pools: list[str] | None = None
    run_ids: list[str] | None = None
    pods: int | None = None
    pending_reasons: dict[str, str] | None = None


def summary(parsed: Parsed, stored: bool = False) -> FileSummary:
    """What a file held: allocations, jobs started and pending, GPUs, and capacity per pool."""
    capacity: list[CapacityRecord] = []
    if parsed.pools is not None:
        capacity = [
            CapacityRecord(str(p), float(t), int(c), int(s))
            for p, t, c, s in zip(
                parsed.pools.pool,
                parsed.pools.time,
                parsed.pools.capacity_gpus,
                parsed.pools.in_service_gpus,
                strict=True,
            )
        ]
    a = parsed.allocations
    if a is None:
        return FileSummary(parsed.format, stored, 0, capacity)
    started = ~np.isnan(a.start)
    return FileSummary(
        parsed.format,
        stored,
        len(a),
        capacity,
        started=int(started.sum()),
        pending=int((~started).sum()),
        gpus=int(a.gpus.sum()),
        pools=sorted({str(p) for p in a.pool}),
        run_ids=sorted({str(r) for r in a.run_id if r}),
        pods=int(sum(parsed.pods.values())) if parsed.pods else None,
        pending_reasons=dict(parsed.pending_reasons) if parsed.pending_reasons else None,
    )


def import_records(
    telemetry: TelemetryStore, scope: Scope, parsed: Parsed, batch_id: str
) -> FileSummary:
    """Store a parsed file's allocations and capacity for the caller's tenant."""
    ctx = {"tenant": scope.tenant}
    if parsed.allocations is not None and len(parsed.allocations):
        telemetry.insert(
            "sched_alloc", pa.table(parsed.allocations.columns()), ctx, f"{batch_id}-alloc"
        )
    if parsed.pools is not None and len(parsed.pools.pool):
        telemetry.insert("sched_pool", pa.table(parsed.pools.columns()), ctx, f"{batch_id}-pool")
    return summary(parsed, stored=True)


def _num(x: Any) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


@dataclass(frozen=True, slots=True)
class Allocation:
    """A stored allocation: submit, start, gang complete (None with ``gang_never_complete``:
    the gang never all started), release; None where unknown."""

    pool: str
    job_id: str
    run_id: str | None
    gpus: int
    state: str
    submit: float | None
    start: float | None
    gang_complete: float | None
    gang_never_complete: bool
    end: float | None
    queue_wait_seconds: float | None


def _allocation(r: dict[str, Any]) -> Allocation:
    start, submit = r["start"], r["submit"]
    wait = start - submit if math.isfinite(start) and math.isfinite(submit) else None
    gc = r["gang_complete"]
    return Allocation(
        pool=r["pool"],
        job_id=r["job_id"],
        run_id=r["run_id"] or None,
        gpus=int(r["gpus"]),
        state=r["state"],
        submit=_num(submit),
        start=_num(start),
        gang_complete=_num(gc if not math.isnan(gc) else start),
        gang_never_complete=bool(math.isinf(gc)),
        end=_num(r["end"]),
        queue_wait_seconds=wait,
    )


def _queries(telemetry: TelemetryStore, scope: Scope) -> SchedQueries:
    return SchedQueries(TenantReader(telemetry, scope))


def run_job_ids(telemetry: TelemetryStore, scope: Scope, run_id: str) -> list[str]:
    """The scheduler job ids a run carries: its job ids and the ``SLURM_JOB_ID`` its ranks saw."""
    rows = _queries(telemetry, scope).job_starts(run_id).to_pylist()
    ids = set()
    for row in rows:
        if row["job_id"]:
            ids.add(str(row["job_id"]))
        try:
            attrs = json.loads(row["attrs"] or "{}")
        except (TypeError, ValueError):
            continue
        env = (attrs.get("launcher") or {}).get("env") or {} if isinstance(attrs, dict) else {}
        if isinstance(env, dict) and env.get("SLURM_JOB_ID"):
            ids.add(str(env["SLURM_JOB_ID"]))
    return sorted(ids)


def allocation_records(
    telemetry: TelemetryStore,
    scope: Scope,
    *,
    run_id: str | None = None,
    job_id: str | None = None,
    pool: str | None = None,
    limit: int = 1000,
) -> list[Allocation]:
    """Stored allocations, oldest submit first; ``run_id`` also finds the jobs the run carries."""
    jobs = run_job_ids(telemetry, scope, run_id) if run_id is not None else []
    rows = _queries(telemetry, scope).allocations(
        limit, run_id=run_id, jobs=jobs, job_id=job_id, pool=pool
    )
    return [_allocation(r) for r in rows.to_pylist()]


def capacity(
    telemetry: TelemetryStore, scope: Scope, pool: str | None = None
) -> list[CapacityRecord]:
    """Each pool's capacity records, in time order."""
    rows = _queries(telemetry, scope).capacity(pool).to_pylist()
    return [
        CapacityRecord(r["pool"], r["time"], int(r["capacity_gpus"]), int(r["in_service_gpus"]))
        for r in rows
    ]


PoolBasis = Literal["pool", "own_allocations"]
SchedulingBasis = Literal["manual", "default", "pool", "own_allocations", "mixed"]


@dataclass(frozen=True, slots=True)
class PoolScheduling:
    """A pool a run drew from: its factor over ``[start, end]``, weighted by the GPU-time the
    run held there."""

    pool: str
    factor: float
    basis: PoolBasis
    start: float
    end: float
    held_gpu_seconds: float


@dataclass(frozen=True, slots=True)
class RunScheduling:
    """A run's scheduling factor and where it came from; ``pools`` and ``jobs`` (None: not
    said) only for one worked out from the run's allocations."""

    factor: float
    basis: SchedulingBasis
    pools: list[PoolScheduling] | None = None
    jobs: list[str] | None = None


def run_scheduling(telemetry: TelemetryStore, scope: Scope, run_id: str) -> RunScheduling | None:
    """The run's scheduling factor from its own allocations, or None when it has none.

    Per pool the run drew from: that pool's scheduling goodput over the interval the run held it
    (basis ``pool``), or, without the pool's capacity, the run's own complete-gang share (basis
    ``own_allocations``); pools are weighted by the GPU-time the run held in each."""
    rows = allocation_records(telemetry, scope, run_id=run_id, limit=10000)
    started = [(a, a.start) for a in rows if a.start is not None]
    if not started:
        return None
    q = GoodputQueries(telemetry, scope)
    sched = _queries(telemetry, scope)
    now = _time.time()
    total = weighted = 0.0
    pools_out = []
    bases: set[PoolBasis] = set()
    for pool in sorted({a.pool for a, _ in started}):
        mine = [(a, s) for a, s in started if a.pool == pool]
        lo = min(s for _, s in mine)
        hi = max(a.end if a.end is not None else now for a, _ in mine)
        gpus = np.array([a.gpus for a, _ in mine], dtype=np.float64)
        start = np.array([s for _, s in mine], dtype=np.float64)
        end = np.array([a.end if a.end is not None else hi for a, _ in mine], np.float64)
        gc = np.array(
            [math.inf if a.gang_never_complete else a.gang_complete for a, _ in mine], np.float64
        )
        held = float(np.sum(gpus * np.maximum(end - start, 0.0)))
        if held <= 0:
            continue
        basis: PoolBasis
        if hi > lo and sched.capacity_records(pool):
            factor = q.pool_scheduling(pool, lo, hi).scheduling_goodput
            basis = "pool"
        else:
            own = scheduling_goodput(
                gpus, start, start, gc, end, PoolCapacity.constant(0.0), window=(lo, hi)
            )
            factor = own.complete_gpu_s / held
            basis = "own_allocations"
        bases.add(basis)
        total += held
        weighted += held * factor
        pools_out.append(PoolScheduling(pool, factor, basis, lo, hi, held))
    if total <= 0:
        return None
    return RunScheduling(
        weighted / total,
        bases.pop() if len(bases) == 1 else "mixed",
        pools_out,
        sorted({a.job_id for a, _ in started}),
    )


def run_scheduling_factor(
    telemetry: TelemetryStore, scope: Scope, run_id: str, manual: float | None = None
) -> RunScheduling:
    """The scheduling factor a run's goodput uses: ``manual`` when given, else the one from the
    run's own allocations (:func:`run_scheduling`), else 1 (``default``: no records)."""
    if manual is not None:
        return RunScheduling(float(manual), "manual")
    return run_scheduling(telemetry, scope, run_id) or RunScheduling(1.0, "default")
