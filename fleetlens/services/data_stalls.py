"""Data stalls: ranks waiting for their input, and why (the analysis loop's per-block check).

A stall is found from the step rows' data wait (:func:`data_stall`); its causes from what the
job reports with ``Run.data`` (:func:`fleetlens.analysis.datapipe.data_causes`): the dataset
shard the stalled ranks read, the storage latency, the prefetch queue, the cache.
"""

from __future__ import annotations

import numpy as np

from ..analysis.datapipe import data_causes
from ..analysis.evidence import Evidence, window
from ..analysis.hardware import node_health, node_signals
from ..analysis.rootcause import Diagnosis
from ..scalars import DATA_SCALARS
from ..store.detect_queries import DetectQueries, JobSpan, Placement, StepMatrix

__all__ = ["COST_SPAN", "MIN_COST", "data_stall"]

MIN_COST = 0.05
"""The least share of the step time a rank's extra data wait must cost to be a stall."""
COST_SPAN = 25
"""The fewest steps (up to the block's end) the cost is judged over."""


def data_stall(
    q: DetectQueries,
    run_id: str,
    job: JobSpan,
    m: StepMatrix,
    place: Placement,
    a: int,
    z: int,
    step_time: float,
) -> list[Diagnosis]:
    """Ranks of one block of steps (``a:z`` of ``m``) whose data wait passes max(10 x the
    block's typical wait, 10% of the step) in 3 steps or more and whose wait beyond the typical
    costs at least :data:`MIN_COST` of the step time from the rank's first such step (at least
    :data:`COST_SPAN` steps) to the block's end (at most half the job: more is the whole job
    slowing, not its input), traced to their shard, storage, prefetch and cache.
    One finding per node: the loaders of two nodes stalling at once are two stalls, each with
    its own onset (a shared cause shows in each one's evidence).

    The cost is what makes a stall: a healthy job's loader waits a few ms of a 100 ms step and
    now and then, when the host is busy, 40 ms; three such waits in a block pass the per-step
    threshold but cost 1-2% of the block. A stall that begins late in a block is judged over
    its last :data:`COST_SPAN` steps, so it is not diluted by the healthy steps before it."""
    dw = m.data_wait[a:z]
    if not np.isfinite(dw).any():
        return []
    with np.errstate(all="ignore"):
        typical = float(np.nanmedian(dw))
    thr = max(0.1 * step_time, 10.0 * typical)
    waits = np.nan_to_num(dw, nan=0.0)
    over = waits > thr
    hits = over.sum(axis=0)
    onset = np.where(over.any(axis=0), np.argmax(over, axis=0), len(dw))
    lo = np.minimum(onset, max(0, len(dw) - COST_SPAN))
    rows = np.arange(len(dw))[:, None]
    excess = np.where(rows >= lo[None, :], np.maximum(waits - typical, 0.0), 0.0).sum(axis=0)
    cost = excess / np.maximum((len(dw) - lo) * step_time, 1e-12)
    ranks = np.flatnonzero((hits >= 3) & (cost >= MIN_COST))
    if not len(ranks) or len(ranks) > 0.5 * m.world:
        return []
    t0, t1 = float(m.start[a]), float(m.end[z - 1])
    nodes = sorted({place.node[r] for r in ranks})
    nh = node_health(q.node_health_rows([n for n in nodes if n], t0, t1))
    causes, cause_ev = _causes(q, run_id, job, m.steps[a:z], over)
    out = []
    for node in nodes:
        mine = np.asarray([r for r in ranks if place.node[r] == node], dtype=np.int64)
        cpu = (
            [s.to_dict() | {"node": node} for s in node_signals(nh[node]) if s.name == "host_cpu"]
            if node in nh
            else []
        )
        first = int(m.steps[a + int(np.argmax(over[:, mine].any(axis=1)))])
        val = float(np.nanmean(dw[:, mine]))
        out.append(
            Diagnosis(
                f"data_stall:{node}",
                "data_stall",
                "slowdown",
                0.9,
                f"input pipeline: {len(mine)} ranks on {node or 'unknown nodes'} wait"
                f" {_dur(val)} per step for data (typical {typical * 1000:.1f} ms of a"
                f" {_dur(step_time)} step)" + (f"; {', '.join(causes)}" if causes else ""),
                step=first,
                start_step=first,
                end_step=int(m.steps[z - 1]),
                time=float(m.start[a]),
                ranks=[int(r) for r in mine],
                nodes=[node] if node else [],
                job_id=job.job_id,
                evidence=[
                    {
                        "metric": "data_wait",
                        "value": val,
                        "baseline": typical,
                        "threshold": thr,
                        "window": window(int(m.steps[a]), int(m.steps[z - 1])),
                    },
                    *cause_ev,
                    *cpu,
                ],
            )
        )
    return out


def _dur(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1.0 else f"{seconds * 1000:.0f} ms"


def _causes(
    q: DetectQueries, run_id: str, job: JobSpan, steps: np.ndarray, stalled: np.ndarray
) -> tuple[list[str], list[Evidence]]:
    """The shard, storage, prefetch and cache signals of the job's ranks over a stalled window
    (``Run.data``), read only once a stall is found."""
    lo, hi = int(steps[0]), int(steps[-1])
    shards = [
        (int(e["rank"]), int(e["step"]), str(e["attrs"].get("shard")))
        for e in q.events(run_id)
        if e["kind"] == "data_shard"
        and e["job_id"] == job.job_id
        and e["attrs"].get("shard") is not None
        and e["step"] <= hi
    ]
    scalars = q.rank_scalars(run_id, job.job_id, list(DATA_SCALARS.values()), lo, hi)
    return data_causes(steps, stalled, shards, scalars)
