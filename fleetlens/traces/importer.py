"""Per-rank Kineto traces -> ``trace_step``, ``trace_kernel`` and ``collective`` tables -> wire
batches.

A directory (every ``*.json`` / ``*.json.gz`` in it) or a list of files, one file per rank. The
rank comes from ``distributedInfo.rank``; a trace without it (single-GPU and some ROCm traces)
takes the number in its file name (``rank-3``, ``rank3``, ``rank_3``), or 0 when it is the only
file. Step numbers are the N of ``ProfilerStep#N``. Times are UNIX seconds when the trace can say
(``baseTimeNanoseconds`` + ts, or timestamps that are UNIX microseconds already); otherwise they
are the trace's own clock in seconds (``clock == "trace"`` in the summary), which is what the
profiler's monotonic clock read (seconds since its origin, usually boot): comparable between the
ranks of one host, not with wall-clock records.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..errors import TraceFormatError
from ..wire import Table, TableBuilder, encode_batch
from .breakdown import (
    StepBreakdown,
    assign_steps,
    hta_comm_comp_overlap,
    hta_temporal_breakdown,
    step_breakdown,
)
from .collectives import Collectives, extract_collectives
from .kineto import COMM, COMPUTE, MEMORY, OTHER, DeviceEvents, KinetoTrace, read_trace

__all__ = [
    "TOP_KERNELS",
    "RankTrace",
    "TopKernel",
    "TraceSummary",
    "analyze",
    "batches",
    "find_trace_files",
    "import_traces",
    "run_tables",
]

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_SUFFIXES = (".json", ".json.gz")
TOP_KERNELS = 10
"""Kernels kept per rank and step: the heaviest by device time."""
_NAME_CHARS = 200
_CATEGORY = {COMPUTE: "compute", COMM: "comm", MEMORY: "memcpy", OTHER: "other"}


@dataclass(frozen=True)
class TopKernel:
    """One of a step's heaviest kernels on a rank: its launches and their summed device time."""

    step: int
    name: str
    category: str
    calls: int
    total: float  # seconds


class TraceSummary(msgspec.Struct, frozen=True, rename="camel"):
    """A rank's trace as ``fleetlens traces import`` prints it (camelCase keys with ``--json``):
    its steps, the mean step in milliseconds and the shares (percent) of the steps' time in
    compute, communication (overlapped with compute, exposed), memory copies and idle; None
    without steps."""

    rank: int
    file: str
    clock: str
    steps: int
    from_step: int | None
    to_step: int | None
    mean_step_ms: float | None
    compute_pct: float | None
    comm_pct: float | None
    overlap_pct: float | None
    exposed_comm_pct: float | None
    memcpy_pct: float | None
    idle_pct: float | None
    kernels: int
    collectives: int
    unattributed_collectives: int


@dataclass
class RankTrace:
    """One rank's trace, analysed: per-step lines (seconds), collectives, HTA's totals."""

    path: str
    rank: int
    clock: str
    events: int
    steps: np.ndarray  # int64 step numbers
    time: np.ndarray  # step start, UNIX (or trace) seconds
    breakdown: StepBreakdown  # seconds
    kernels: np.ndarray  # int64 per step
    collectives: Collectives  # enter/exit in seconds (same clock as `time`)
    hta: dict[str, float]  # HTA-compatible whole-trace temporal breakdown + overlap %
    top_kernels: list[TopKernel]  # per step, its TOP_KERNELS heaviest, heaviest first
    world_size: int | None = None  # distributedInfo.world_size
    groups: tuple[tuple[str, tuple[int, ...]], ...] = ()  # its process groups (description, ranks)

    def summary(self) -> TraceSummary:
        """Where the rank's step time went, in shares of it (``traces import`` prints it)."""
        b = self.breakdown
        total = float(b.duration.sum())

        def pct(x: np.ndarray) -> float | None:
            return round(100.0 * float(x.sum()) / total, 2) if total > 0 else None

        n = len(self.steps)
        return TraceSummary(
            rank=self.rank,
            file=Path(self.path).name,
            clock=self.clock,
            steps=n,
            from_step=int(self.steps.min()) if n else None,
            to_step=int(self.steps.max()) if n else None,
            mean_step_ms=round(1000.0 * total / n, 3) if n else None,
            compute_pct=pct(b.compute),
            comm_pct=pct(b.comm),
            overlap_pct=pct(b.overlap),
            exposed_comm_pct=pct(b.exposed_comm),
            memcpy_pct=pct(b.memcpy),
            idle_pct=pct(b.idle),
            kernels=int(self.kernels.sum()),
            collectives=len(self.collectives),
            unattributed_collectives=self.collectives.unattributed,
        )


def find_trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand directories into their trace files, at any depth (a profiler writes one folder
    per worker or per run); keep files as given; sorted, no duplicates."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(_SUFFIXES))
        elif p.is_file():
            found.append(p)
        else:
            raise TraceFormatError(f"trace path {p} does not exist")
    unique = list(dict.fromkeys(f.resolve() for f in found))
    if not unique:
        raise TraceFormatError(
            f"no trace files (*.json, *.json.gz) under {', '.join(map(str, paths))}"
        )
    return unique


def _hta_view(trace: KinetoTrace) -> dict[str, float]:
    """HTA keeps the kernels launched before the last ProfilerStep began (when there are two or
    more) and measures over the span of those kernels; see docs/traces.md."""
    d = trace.device
    keep = np.ones(len(d), dtype=bool)
    if len(trace.steps) >= 2:
        keep = d.launch < trace.step_start.max()  # NaN (no launch found) compares False
    out = hta_temporal_breakdown(d.start[keep], d.end[keep], d.kind[keep])
    out["comm_comp_overlap_pct"] = hta_comm_comp_overlap(d.start[keep], d.end[keep], d.kind[keep])
    return out


def _top_kernels(d: DeviceEvents, steps: np.ndarray, step_idx: np.ndarray) -> list[TopKernel]:
    """Per step, the :data:`TOP_KERNELS` kernel names with the most device time (launches
    summed; the step a kernel belongs to is its launch's, as HTA has it)."""
    ok = step_idx >= 0
    if not ok.any():
        return []
    names, first, code = np.unique(
        np.asarray(d.names, dtype=object)[ok], return_index=True, return_inverse=True
    )
    first_kind = d.kind[ok][first]  # the kind of each name's first launch
    key = step_idx[ok] * len(names) + code
    size = len(steps) * len(names)
    total = np.bincount(key, weights=(d.end - d.start)[ok], minlength=size)
    calls = np.bincount(key, minlength=size)
    total, calls = total.reshape(len(steps), -1), calls.reshape(len(steps), -1)
    out: list[TopKernel] = []
    for i, step in enumerate(steps):
        heavy = np.argsort(-total[i], kind="stable")[:TOP_KERNELS]
        out += [
            TopKernel(
                int(step),
                str(names[j])[:_NAME_CHARS],
                _CATEGORY.get(int(first_kind[j]), "other"),
                int(calls[i, j]),
                float(total[i, j]) / 1e6,
            )
            for j in heavy
            if calls[i, j]
        ]
    return out


def analyze(trace: KinetoTrace, rank: int | None = None) -> RankTrace:
    """Per-step breakdown, kernel counts and collectives of one parsed trace."""
    r = rank if rank is not None else trace.rank
    if r is None or r < 0:
        raise TraceFormatError(f"{trace.path}: no rank (distributedInfo.rank); pass one")
    d = trace.device
    start, end, kind = d.start, d.end, d.kind
    if len(d) == 0:
        # CPU-only (gloo) trace: its collectives are the only "device" activity there is.
        gloo = [o for o in trace.comm_ops if o.name.startswith("gloo:")]
        start = np.array([o.start for o in gloo], dtype=np.float64)
        end = np.array([o.end for o in gloo], dtype=np.float64)
        kind = np.full(len(gloo), COMM, dtype=np.int8)
    bd_us = step_breakdown(trace.step_start, trace.step_dur, start, end, kind)
    bd = StepBreakdown(*(np.asarray(v) / 1e6 for v in vars(bd_us).values()))
    launched = np.where(np.isnan(d.launch), d.start, d.launch)
    every = assign_steps(launched, trace.step_start, trace.step_dur)
    idx = every[d.kind != MEMORY]
    kernels = np.bincount(idx[idx >= 0], minlength=len(trace.steps)).astype(np.int64)
    coll = extract_collectives(trace)
    coll.enter = list(trace.to_unix(np.asarray(coll.enter, dtype=np.float64)))
    coll.exit = list(trace.to_unix(np.asarray(coll.exit, dtype=np.float64)))
    return RankTrace(
        path=trace.path,
        rank=int(r),
        clock=trace.clock,
        events=trace.events,
        steps=trace.steps,
        time=trace.to_unix(trace.step_start),
        breakdown=bd,
        kernels=kernels,
        collectives=coll,
        hta=_hta_view(trace),
        top_kernels=_top_kernels(d, trace.steps, every),
        world_size=trace.world_size,
        groups=trace.groups,
    )


def _rank_from_name(path: Path) -> int | None:
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


def import_traces(paths: Iterable[str | Path]) -> Iterator[RankTrace]:
    """Parse and analyse each rank's trace, one at a time (a trace's memory is freed before the
    next is read). Two files of the same rank are refused: a run has one trace per rank."""
    files = find_trace_files(paths)
    seen: dict[int, Path] = {}
    for f in files:
        trace = read_trace(f)
        rank = trace.rank if trace.rank is not None else _rank_from_name(f)
        if rank is None:
            if len(files) > 1:
                raise TraceFormatError(
                    f"{f}: the trace has no distributedInfo.rank and its name has no rank "
                    "number; rename it rank-N.json.gz or import it on its own"
                )
            rank = 0
        if rank in seen:
            raise TraceFormatError(f"{f} and {seen[rank]} are both rank {rank}; import one")
        seen[rank] = f
        yield analyze(trace, rank)


def tables(rt: RankTrace) -> dict[str, Table]:
    """The ``trace_step``, ``trace_kernel`` and ``collective`` tables of one rank."""
    n = len(rt.steps)
    b = rt.breakdown
    ts = TableBuilder("trace_step")
    ts.add_packed("step", rt.steps.astype("<i8").tobytes())
    ts.add_packed("rank", np.full(n, rt.rank, dtype="<i4").tobytes())
    ts.add_packed("time", np.asarray(rt.time, dtype="<f8").tobytes())
    for name in ("duration", "compute", "comm", "exposed_comm", "overlap", "memcpy", "idle"):
        ts.add_packed(name, np.asarray(getattr(b, name), dtype="<f8").tobytes())
    ts.add_packed("kernels", rt.kernels.astype("<i8").tobytes())
    ts.add("source", [Path(rt.path).name] * n)
    out = {"trace_step": ts.build()}
    if rt.top_kernels:
        start = dict(
            zip(rt.steps.tolist(), np.asarray(rt.time, dtype=np.float64).tolist(), strict=True)
        )
        k = rt.top_kernels
        tk = TableBuilder("trace_kernel")
        tk.add_packed("step", np.array([x.step for x in k], dtype="<i8").tobytes())
        tk.add_packed("rank", np.full(len(k), rt.rank, dtype="<i4").tobytes())
        tk.add_packed("time", np.array([start[x.step] for x in k], dtype="<f8").tobytes())
        tk.add("name", [x.name for x in k]).add("category", [x.category for x in k])
        tk.add_packed("calls", np.array([x.calls for x in k], dtype="<i8").tobytes())
        tk.add_packed("total", np.array([x.total for x in k], dtype="<f8").tobytes())
        tk.add("source", [Path(rt.path).name] * len(k))
        out["trace_kernel"] = tk.build()
    c = rt.collectives
    if len(c):
        ct = TableBuilder("collective")
        ct.add_packed("step", np.asarray(c.step, dtype="<i8").tobytes())
        ct.add_packed("rank", np.full(len(c), rt.rank, dtype="<i4").tobytes())
        ct.add_packed("seq", np.asarray(c.seq, dtype="<i8").tobytes())
        ct.add("op", c.op).add("group", c.group)
        ct.add_packed("enter", np.asarray(c.enter, dtype="<f8").tobytes())
        ct.add_packed("exit", np.asarray(c.exit, dtype="<f8").tobytes())
        ct.add_packed("bytes", np.asarray(c.bytes, dtype="<i8").tobytes())
        out["collective"] = ct.build()
    return out


def run_tables(rt: RankTrace, start: dict[str, Any] | None = None) -> dict[str, Table]:
    """The rank's profiled steps as the run's own ``step`` rows (``traces import --as-run``), so
    the run is analysed as a live one is (stragglers against their peers, stage imbalance, the
    what-if): each step's span and its exposed communication, compute being what is left. With
    ``start`` (the job_start attributes: config, world size), also the attempt's start and its
    end at this rank's last step: a trace is history, not a live job."""
    n = len(rt.steps)
    st = TableBuilder("step")
    st.add_packed("step", rt.steps.astype("<i8").tobytes())
    st.add_packed("rank", np.full(n, rt.rank, dtype="<i4").tobytes())
    st.add_packed("time", np.asarray(rt.time, dtype="<f8").tobytes())
    st.add_packed("duration", np.asarray(rt.breakdown.duration, dtype="<f8").tobytes())
    st.add_packed("comm", np.asarray(rt.breakdown.exposed_comm, dtype="<f8").tobytes())
    out = {"step": st.build()}
    if start is not None and n:
        first, last = int(rt.steps[0]), int(rt.steps[-1])
        end = float(rt.time[-1] + rt.breakdown.duration[-1])
        ev = TableBuilder("event")
        ev.add("time", [float(rt.time[0]), end]).add("kind", ["job_start", "finish"])
        ev.add("step", [first - 1, last])
        ev.add("message", ["profiled steps", "the imported traces end here"])
        ev.add("attrs", [json.dumps(start), json.dumps({"inferred": "end of trace"})])
        out["event"] = ev.build()
    return out


def batches(
    rt: RankTrace,
    run_id: str,
    job_id: str = "",
    as_run: bool = False,
    start: dict[str, Any] | None = None,
) -> tuple[str, bytes]:
    """One wire batch (id, gzip body) for one rank; its id is stable for the same file and run,
    so importing the same trace twice stores it once. ``as_run``: the rank's steps go in as the
    run's too, with the attempt's ``start`` and end when given (:func:`run_tables`)."""
    ctx = {"run_id": run_id}
    if job_id:
        ctx["job_id"] = job_id
    out = tables(rt)
    key = f"{run_id}\0{job_id}\0{rt.rank}\0{rt.path}"
    if as_run:
        out.update(run_tables(rt, start))
        key += "\0as-run"
    digest = hashlib.sha256(key.encode()).hexdigest()
    return encode_batch(
        out, ctx, batch_id=f"trace-{digest[:32]}", source="fleetlens-traces", compress=True
    )
