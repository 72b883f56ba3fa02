"""The analysis loop's look at a run's training scalars: a loss or gradient norm that went
unstable (NaN, a spike, skipped iterations), in the window judged and in scalars that come
after their steps' rows."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..analysis.rootcause import Diagnosis, diagnose_instability
from ..store.detect_queries import DetectQueries, JobSpan
from ..store.findings import RunToAnalyze
from .cursor import AttemptState, ScalarWatch

__all__ = ["SETTLE_ARRIVALS", "instability", "late_scalars"]

SETTLE_ARRIVALS = 10
"""Arrivals an older attempt's late scalars are still looked at after they stopped changing."""


def late_scalars(
    q: DetectQueries, run: RunToAnalyze, job: JobSpan, js: AttemptState, newest: bool
) -> list[Diagnosis]:
    """Scalars of an attempt whose last window was judged may come later (an importer sends
    steps, then scalars; a loss logged after its step's row), older than the run's newest
    record. Judged again on each pass that data of the run arrived (whenever that is): the
    newest attempt's always, an older one's while they change and :data:`SETTLE_ARRIVALS`
    arrivals after."""
    seen = js.scalars
    if seen is None or not run.arrived or (not newest and seen.unchanged >= SETTLE_ARRIVALS):
        return []
    found, n = instability(
        q, run.run_id, job, job.last_step + 1, 2**62 if newest else job.last_step
    )
    js.scalars = ScalarWatch(n, seen.unchanged + 1 if n == seen.rows else 0)
    return found


def instability(
    q: DetectQueries, run_id: str, job: JobSpan, lo: int, hi: int
) -> tuple[list[Diagnosis], int]:
    """An instability in the job's scalars of steps ``lo``-200..``hi``, and what it read (a
    count of rows, to tell whether scalars came since)."""
    sc = q.scalars(
        run_id,
        ["loss", "grad_norm", "lr", "skipped_iterations"],
        max(0, lo - 200),
        hi,
        job.job_id,
    )
    rows = sum(len(v[0]) + int(np.isnan(v[1]).sum()) for v in sc.values())
    if "loss" not in sc and "grad_norm" not in sc:
        return [], rows
    steps = np.unique(np.concatenate([v[0] for v in sc.values()]))

    def col(name: str) -> Any:
        out = np.full(len(steps), np.nan)
        if name in sc:
            out[np.searchsorted(steps, sc[name][0])] = sc[name][1]
        return out

    logged = np.zeros(len(steps), bool)  # a step with no loss logged has no NaN loss either
    if "loss" in sc:
        logged[np.searchsorted(steps, sc["loss"][0])] = True
    d = diagnose_instability(
        steps,
        col("loss"),
        col("grad_norm"),
        col("lr"),
        loss_logged=logged,
        skipped=col("skipped_iterations"),
    )
    if d is None or d.step < lo - 200:
        return [], rows
    d.job_id = job.job_id
    return [d], rows
