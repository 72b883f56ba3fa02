"""Wire batches as the SDK sends them, built from arrays (per-rank step records, and the
scalars of a run that logs many metric names)."""

from __future__ import annotations

import time

import numpy as np

from ..wire import TableBuilder, encode_batch


def step_batch(
    run_id: str,
    steps: range,
    ranks: int,
    *,
    job_id: str = "j1",
    base: float = 0.4,
    slow: dict[int, float] | None = None,
    t0: float | None = None,
    tokens: int = 1000,
    batch_id: str | None = None,
    ctx: dict[str, str] | None = None,
) -> tuple[str, bytes]:
    """A batch of per-rank step records; ``slow`` maps rank -> slowdown factor."""
    n_steps = len(steps)
    step = np.repeat(np.asarray(steps, dtype="<i8"), ranks)
    rank = np.tile(np.arange(ranks, dtype="<i4"), n_steps)
    dur = np.full(len(step), base)
    for r, factor in (slow or {}).items():
        dur[rank == r] = base * factor
    start = (t0 if t0 is not None else time.time() - 60) + (step - steps.start) * base * 1.2
    tb = TableBuilder("step")
    tb.add_packed("step", step.tobytes()).add_packed("rank", rank.tobytes())
    tb.add_packed("time", start.astype("<f8").tobytes())
    tb.add_packed("duration", dur.astype("<f8").tobytes())
    tb.add_packed("tokens", np.full(len(step), tokens, dtype="<i8").tobytes())
    context = {"run_id": run_id, "job_id": job_id, "project": "test", **(ctx or {})}
    return encode_batch({"step": tb.build()}, context, batch_id=batch_id)


def scalar_grid(run_id: str, names: list[str], values: np.ndarray, t0: float) -> bytes:
    """A gzip batch of rank 0's scalars: ``values[s, k]`` is metric ``names[k]`` at step ``s``,
    logged at ``t0 + s`` (a run that logs a value of every name at every step)."""
    steps, width = values.shape
    tb = TableBuilder("scalar")
    tb.add_packed("step", np.repeat(np.arange(steps, dtype="<i8"), width).tobytes())
    tb.add_packed("rank", np.zeros(steps * width, dtype="<i4").tobytes())
    tb.add_packed("time", (t0 + np.repeat(np.arange(steps, dtype="<f8"), width)).tobytes())
    tb.add_dict("name", names, np.tile(np.arange(width, dtype="<i4"), steps).tobytes())
    tb.add_packed("value", values.astype("<f8").ravel().tobytes())
    return encode_batch({"scalar": tb.build()}, {"run_id": run_id}, compress=True)[1]
