"""The straggler pass of the analysis loop: the episodes of ranks slower than their peers,
classified (persistent, intermittent, moving) and diagnosed with the evidence that names a cause:
the GPUs' health and how often the rank arrived last at a collective."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..analysis.collectives import analyze_collectives
from ..analysis.evidence import Evidence
from ..analysis.hardware import GpuHealth, Signal, gpu_health, gpu_signals
from ..analysis.ranks import RankState, open_episodes
from ..analysis.rootcause import Diagnosis, diagnose_straggler
from ..analysis.stragglers import classify_episodes
from ..store.detect_queries import DetectQueries, JobSpan
from ..store.findings import RunToAnalyze

__all__ = ["straggler_findings"]


def straggler_findings(
    q: DetectQueries,
    run: RunToAnalyze,
    jobs: list[JobSpan],
    jstate: dict[str, Any],
    tails: dict[str, RankState],
) -> list[Diagnosis]:
    """The run's straggler findings from every attempt's episodes (closed ones in the cursor's
    state, open ones in this pass's tails), classified and diagnosed with their GPUs' health."""
    episodes = []
    places: dict[int, tuple[str, int, str]] = {}
    for job in jobs:
        js = jstate.get(job.job_id)
        if not js or "cusum" not in js:
            continue
        rs = tails.get(job.job_id) or RankState.from_json(
            js["cusum"], int(js["cusum"].get("world", 0))
        )
        still = open_episodes(rs)
        if job is not jobs[-1]:  # a later attempt exists: this one's episodes ended with it
            for e in still:
                e.end = int(js.get("sealed", job.last_step))
        eps = rs.episodes + still
        if eps:
            place = q.placement(run.run_id, job.job_id, rs.c.shape[0])
            for e in eps:
                places[e.rank] = place.of(e.rank)
        episodes += eps
    out = []
    span = {j.job_id: j for j in jobs}

    def t_of(step: int) -> float:
        for j in span.values():
            if j.first_step <= step <= j.last_step and j.last_step > j.first_step:
                return j.start + (step - j.first_step) / (j.last_step - j.first_step) * (
                    j.end - j.start
                )
        return jobs[-1].end

    for c in classify_episodes(episodes):
        t0, t1 = t_of(c.start), t_of(c.end if c.end >= 0 else jobs[-1].last_step)
        sigs: dict[int, list[Signal]] = {}
        if c.diagnosis != "straggler.moving":
            nodes = [places[r][0] for r in c.ranks if r in places]
            gh: dict[tuple[str, int], GpuHealth] = gpu_health(q.gpu_health_rows(nodes, t0, t1))
            for r in c.ranks:
                g = gh.get(places.get(r, ("", -1, ""))[:2])
                sigs[r] = [s for s in gpu_signals(g) if s.name != "xid"] if g else []
        step_time = float(
            np.median([(j.end - j.start) / max(j.last_step - j.first_step + 1, 1) for j in jobs])
        )
        d = diagnose_straggler(c, sigs, places, step_time, {c.detected: t_of(c.detected)})
        if c.passing and d.diagnosis == "straggler.persistent":
            continue  # one short slow spell, over: not a straggler (a hot GPU's still is)
        d.evidence.extend(_last_arrivals(q, run, jobs, c.ranks, c.start, c.end))
        out.append(d)
    return out


def _last_arrivals(
    q: DetectQueries,
    run: RunToAnalyze,
    jobs: list[JobSpan],
    ranks: Sequence[int],
    start: int,
    end: int,
) -> list[Evidence]:
    """The clock-free collective evidence: how often the straggler arrived last."""
    job = jobs[-1]
    hi = end if end >= 0 else job.last_step
    lo = max(start, hi - 200)  # bounded: the recent part of the episode says enough
    col = q.collectives(run.run_id, job.job_id, lo, hi)
    if not len(col["step"]):
        return []
    rep = analyze_collectives(col["step"], col["seq"], col["rank"], col["enter"], col["exit"])
    counts = rep.last_rank_counts()
    total = len(rep.verdict)
    return [
        {
            "signal": "last_arriver",
            "metric": "collectives where this rank arrived last",
            "rank": r,
            "value": counts.get(r, 0) / total,
            "collectives": total,
            "waited_for_median_s": float(np.median(rep.lateness_s[rep.last_rank == r]))
            if counts.get(r)
            else 0.0,
        }
        for r in ranks[:4]
    ]
