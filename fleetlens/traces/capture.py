"""A rank's triggered capture (a few profiled steps, :mod:`fleetlens.torch.capture`) read for
its finding: per step, where the time went, the heaviest kernels and collectives; and the
tables it is stored as beside imported traces.

The side-by-side of a lagging rank and its healthy peer is made of two of these
(:func:`rank_summary`). On a GPU the lines are the device's (compute, communication, memory
copies, idle); a trace with no device activity (CPU training, gloo) says so with ``host_only``,
and its ``compute_ms`` is the host's own work: the step less the time in collectives.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np

from ..wire import encode_batch
from .importer import RankTrace, tables
from .summary import RankSummary, TopCollective, TopKernel

__all__ = ["TOP", "capture_batch", "rank_summary"]

TOP = 5
"""Kernels and collectives kept per rank in a capture's summary: the heaviest."""


def _mean_ms(x: np.ndarray, n: int) -> float:
    return round(1000.0 * float(np.asarray(x).sum()) / n, 3)


def rank_summary(rt: RankTrace) -> RankSummary:
    """Rank ``rt.rank``'s captured steps: mean milliseconds a step per line, the kernels and
    collectives with the most time (summed over the steps), the trace's clock."""
    n = len(rt.steps)
    if n == 0:
        return RankSummary(steps=0)
    b = rt.breakdown
    host_only = int(rt.kernels.sum()) == 0
    c = rt.collectives
    spent = np.asarray(c.exit, dtype=np.float64) - np.asarray(c.enter, dtype=np.float64)
    by_op: dict[str, list[float]] = {}
    for op, s in zip(c.op, spent.tolist(), strict=True):
        got = by_op.setdefault(op, [0, 0.0])
        got[0] += 1
        got[1] += s
    colls = sorted(by_op.items(), key=lambda kv: -kv[1][1])[:TOP]
    kern: dict[tuple[str, str], list[float]] = {}
    for k in rt.top_kernels:
        got = kern.setdefault((k.name, k.category), [0, 0.0])
        got[0] += k.calls
        got[1] += k.total
    kernels = sorted(kern.items(), key=lambda kv: -kv[1][1])[:TOP]
    compute = b.duration - b.exposed_comm - b.memcpy if host_only else b.compute
    return RankSummary(
        steps=n,
        from_step=int(rt.steps.min()),
        to_step=int(rt.steps.max()),
        clock=rt.clock,
        host_only=host_only,
        step_ms=_mean_ms(b.duration, n),
        compute_ms=_mean_ms(compute, n),
        comm_ms=_mean_ms(b.comm, n),
        exposed_comm_ms=_mean_ms(b.exposed_comm, n),
        memcpy_ms=_mean_ms(b.memcpy, n),
        idle_ms=None if host_only else _mean_ms(b.idle, n),
        kernels=int(rt.kernels.sum()),
        collectives=len(c),
        top_kernels=tuple(
            TopKernel(name=name, category=cat, calls=int(v[0]), total_ms=round(v[1] * 1e3, 3))
            for (name, cat), v in kernels
        ),
        top_collectives=tuple(
            TopCollective(op=op, calls=int(v[0]), total_ms=round(v[1] * 1e3, 3)) for op, v in colls
        ),
    )


def capture_batch(rt: RankTrace, run_id: str, job_id: str, capture_id: int) -> bytes:
    """The rank's ``trace_step`` and ``trace_kernel`` rows as one wire batch (gzip), its id
    stable for the capture and rank: a retried upload is stored once. Its collectives are not
    stored as the run's: the job's own timing already sends them."""
    named = replace(rt, path=f"capture-{capture_id}-rank{rt.rank}.json.gz")  # the rows' source
    out = {k: v for k, v in tables(named).items() if k != "collective"}
    ctx = {"run_id": run_id}
    if job_id:
        ctx["job_id"] = job_id
    digest = hashlib.sha256(f"{run_id}\0{capture_id}\0{rt.rank}".encode()).hexdigest()
    _, body = encode_batch(
        out, ctx, batch_id=f"capture-{digest[:32]}", source="fleetlens-capture", compress=True
    )
    return body
