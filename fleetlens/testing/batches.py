"""Wire batches as the SDK sends them, built from arrays (per-rank step records)."""

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
