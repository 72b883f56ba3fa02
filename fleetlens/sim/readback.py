"""A simulated run read back from a :class:`MemorySink` as the store would serve it.

``step_executions`` recomputes the ``steps_by_step`` rollup (see ``fleetlens/store/ddl.py``) in
numpy: one row per step and job attempt with the first start, the last end, the slowest and the
mean rank's compute (forward + backward + optimizer, else duration less comm and input wait)
and the longest input wait. ``events`` returns the run's events. Together they are the inputs
of :func:`fleetlens.analysis.breakdown.breakdown`, so a simulated run's goodput can be computed
in-process, without a store, and compared with its ground truth.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..analysis.breakdown import Event, StepArrays
from .emit import MemorySink

__all__ = ["events", "step_executions"]


def _finite(x: Any) -> Any:
    a = np.asarray(x, dtype=np.float64)
    return np.where(np.isfinite(a), a, 0.0)


def step_executions(sink: MemorySink) -> StepArrays:
    """The per-(step, attempt) rollup of every ``step`` record the sink holds."""
    parts: list[dict[str, Any]] = []
    for ctx, tables in sink.batches:
        if "step" not in tables:
            continue
        n, cols = tables["step"]

        def col(name: str, n: int = n, cols: dict[str, Any] = cols) -> Any:
            v = cols.get(name)
            return np.full(n, np.nan) if v is None else np.broadcast_to(np.asarray(v), (n,))

        phases = col("forward") + col("backward") + col("optimizer")
        dw = _finite(col("data_wait"))
        dur = col("duration").astype(np.float64)
        compute = np.where(np.isfinite(phases), phases, dur - _finite(col("comm")) - dw)
        t = col("time").astype(np.float64)
        parts.append(
            {
                "step": col("step"),
                "job": ctx.get("job_id", ""),
                "time": t,
                "end": t + dur,
                "compute": compute,
                "dw": dw,
            }
        )
    if not sum(len(p["step"]) for p in parts):
        return StepArrays.empty()
    step = np.concatenate([p["step"] for p in parts]).astype(np.int64)
    names = sorted({p["job"] for p in parts})
    code = np.concatenate([np.full(len(p["step"]), names.index(p["job"])) for p in parts])
    # One sort by (attempt, step), then segment reductions: ufunc.at is too slow for millions.
    order = np.lexsort((step, code))
    step, code = step[order], code[order]
    cut = np.flatnonzero((np.diff(step) != 0) | (np.diff(code) != 0)) + 1
    first = np.r_[0, cut]
    ranks = np.diff(np.r_[first, len(step)])

    def joined(name: str) -> Any:
        return np.concatenate([p[name] for p in parts])[order]

    return StepArrays(
        step=step[first],
        job_id=np.asarray(names, dtype=object)[code[first]],
        start=np.minimum.reduceat(joined("time"), first),
        end=np.maximum.reduceat(joined("end"), first),
        max_compute=np.maximum.reduceat(joined("compute"), first),
        mean_compute=np.add.reduceat(joined("compute"), first) / ranks,
        data_wait=np.maximum.reduceat(joined("dw"), first),
    )


def events(sink: MemorySink) -> list[Event]:
    """The run's events, as :class:`Event` (attrs decoded from their JSON text)."""
    out: list[Event] = []
    for ctx, tables in sink.batches:
        if "event" not in tables:
            continue
        n, cols = tables["event"]
        times, kinds = np.asarray(cols["time"]), cols["kind"]
        steps, attrs = np.asarray(cols["step"]), cols.get("attrs", [""] * n)
        for i in range(n):
            row = {
                "time": times[i],
                "kind": kinds[i],
                "job_id": ctx.get("job_id", ""),
                "step": int(steps[i]),
                "attrs": attrs[i],
            }
            out.append(Event.from_row(row))
    return out
