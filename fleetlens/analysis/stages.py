"""Pipeline-stage imbalance: a stage that computes longer than the others at every replica.

In a pipeline-parallel job each stage holds a share of the layers; the last one also computes
the loss and the output embedding, the first the input embedding. When the split is uneven, the
ranks of one stage compute longer at *every* data-parallel replica, and in the pipeline's steady
state (1F1B, interleaved or not) every stage waits for the slowest one. That is a partitioning
choice of the training configuration, not a slow worker: the ranks are judged against their own
stage (:func:`fleetlens.analysis.layout.peer_normalize`) and the stage against the others here.

The cost is a what-if, after "Understanding Stragglers in Large Model Training Using What-if
Analysis" (OSDI 2025): each step is replayed with the slowest stage's ranks brought to the next
slowest stage's time (the other stages' median would leave that one setting the pace), their
noise kept; the step, which waits for its last rank, shortens by the difference; the sum over
the steps against their wall time is the share of the job's time the imbalance costs, and
``S = saved / (wall - saved)`` how much faster the job would be. A stage with one rank has no
peer: its worker's slowness reads as the stage's.

**Uneven batches** (``batch_imbalance``, owner the data pipeline): a replica whose batch costs
more one step (longer sequences, fuller packing) computes longer at *every* stage that step, and
the next step another replica does. Each replica's excess over the replicas' median is measured
over the first half of the stages and over the second (:func:`fleetlens.analysis.whatif.
replica_excess`); less each replica's mean over its block (what persists, a slow worker, is the
straggler scan's), what the two halves share step by step is the batches' doing: a rank's noise
and a slow worker show in one half only. When they share at least ``batch_min_spread`` (3%, as a
standard deviation) with a correlation of 0.5 or more, the attempt gets one finding with the
what-if saving of every replica's batch at the median (:func:`~fleetlens.analysis.whatif.
batch_factor`).

Everything carried between passes is a :class:`StageTally` of sums over complete blocks of
steps, so the verdict is the same whatever the passes the steps arrived in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .layout import ParallelLayout
from .rootcause import Diagnosis
from .whatif import (
    BatchMoments,
    batch_factor,
    batch_moments,
    replica_excess,
    stage_scale,
    stage_times,
)

__all__ = ["StageTally", "batch_imbalance", "fold_tp_groups", "stage_imbalance", "tally_stages"]

MIN_STEPS = 10  # steps tallied before a verdict
MIN_BATCH_DOF = 60  # (step, replica) pairs, less a block's mean per replica, before a verdict
MIN_BATCH_CORR = 0.5  # the halves' correlation from which their shared variation is the batch's


@dataclass
class StageTally:
    """Sums over the steps judged so far: each stage's (lower) median compute, the what-if saving of
    bringing the slowest stage to its peers' median, and the steps' wall time."""

    steps: int = 0
    compute: list[float] = field(default_factory=list)  # per stage, seconds summed over steps
    saved: float = 0.0  # seconds
    wall: float = 0.0  # seconds
    first: int = -1  # first step tallied
    last: int = -1
    start: float = 0.0  # when the first tallied step began (UNIX seconds)
    batch: list[float] = field(default_factory=list)  # BatchMoments: dof, ab, aa, bb
    batch_saved: float = 0.0  # seconds: the what-if saving of every replica's batch at the median

    @property
    def moments(self) -> BatchMoments:
        return BatchMoments(*self.batch) if len(self.batch) == 4 else BatchMoments()

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> StageTally:
        return cls(**d) if d else cls()

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "compute": self.compute,
            "saved": self.saved,
            "wall": self.wall,
            "first": self.first,
            "last": self.last,
            "start": self.start,
            "batch": self.batch,
            "batch_saved": self.batch_saved,
        }


def tally_stages(
    tally: StageTally,
    steps: np.ndarray[Any, Any],
    compute: np.ndarray[Any, Any],
    step_time: np.ndarray[Any, Any],
    start: np.ndarray[Any, Any],
    stages: np.ndarray[Any, Any],
    pp: int,
    replicas: np.ndarray[Any, Any] | None = None,
    blocks: np.ndarray[Any, Any] | None = None,
) -> StageTally:
    """Add consecutive steps (``compute`` steps x ranks, raw seconds; ``stages`` and
    ``replicas`` each rank's stage and data-parallel replica; ``blocks`` each step's block) to
    the tally. Steps where a stage reported no rank are skipped."""
    if not len(steps) or pp < 2:
        return tally
    n = compute.shape[1]
    st = stages[:n]
    per = stage_times(compute, st, pp)
    ok = np.isfinite(per).all(axis=1) & np.isfinite(step_time)
    if not ok.any():
        return tally
    per, wall = per[ok], step_time[ok]
    # The step waits for its last rank: replayed with the slowest stage's ranks brought to the
    # next slowest stage's time (their own noise kept), it ends that much sooner.
    c = compute[ok]
    scale = stage_scale(per, st)
    with np.errstate(all="ignore"):
        saved = np.nanmax(c, axis=1) - np.nanmax(c * scale, axis=1)
    saved = np.minimum(np.clip(np.nan_to_num(saved), 0.0, None), wall)
    sums = per.sum(axis=0)
    if len(tally.compute) != pp:
        tally = StageTally(start=float(start[ok][0]), first=int(steps[ok][0]))
        tally.compute = [0.0] * pp
    tally.compute = [a + float(b) for a, b in zip(tally.compute, sums, strict=True)]
    tally.steps += int(ok.sum())
    tally.saved += float(saved.sum())
    tally.wall += float(wall.sum())
    tally.last = int(steps[ok][-1])
    if replicas is not None and blocks is not None:
        _tally_batches(tally, c, st, replicas[:n], blocks[ok], pp, wall)
    return tally


def _tally_batches(
    tally: StageTally,
    c: np.ndarray[Any, Any],
    st: np.ndarray[Any, Any],
    rep: np.ndarray[Any, Any],
    blocks: np.ndarray[Any, Any],
    pp: int,
    wall: np.ndarray[Any, Any],
) -> None:
    """The replicas' shared excess (:class:`BatchMoments`) and, block by block, the what-if
    saving of their batches at the median (the block's own weight: fixed blocks, so the sums
    do not depend on the passes)."""
    halves = replica_excess(c, st, rep, pp)
    if halves is None:
        return
    a, b = halves
    total = tally.moments
    saved = 0.0
    with np.errstate(all="ignore"):
        for blk in np.unique(blocks):
            rows = blocks == blk
            m = batch_moments(a[rows], b[rows], blocks[rows])
            total += m
            f = batch_factor(a[rows], b[rows], rep, m.weight)
            cut = np.nanmax(c[rows], axis=1) - np.nanmax(c[rows] / f, axis=1)
            saved += float(np.minimum(np.clip(np.nan_to_num(cut), 0.0, None), wall[rows]).sum())
    tally.batch = [total.dof, total.ab, total.aa, total.bb]
    tally.batch_saved += saved


def stage_imbalance(
    tally: StageTally, layout: ParallelLayout, job_id: str, min_excess: float
) -> list[Diagnosis]:
    """The attempt's ``stage_imbalance`` finding when its slowest stage computes at least
    ``min_excess`` (0.05: 5%) longer than the other stages' median over the steps tallied."""
    if tally.steps < MIN_STEPS or len(tally.compute) < 2:
        return []
    mean = np.asarray(tally.compute) / tally.steps
    k = int(np.argmax(mean))
    median = float(np.median(np.delete(mean, k)))  # its peers: the other stages
    if median <= 0 or mean[k] / median - 1.0 < min_excess:
        return []
    excess = mean[k] / median - 1.0
    share = tally.saved / tally.wall if tally.wall > 0 else 0.0
    speedup = tally.saved / (tally.wall - tally.saved) if tally.wall > tally.saved else 0.0
    per_stage = layout.world // layout.pp
    ranks = np.flatnonzero(layout.stages(layout.world) == k).tolist()
    role = (
        "; it also computes the loss and the output embedding"
        if k == layout.pp - 1
        else "; it also computes the input embedding"
        if k == 0
        else ""
    )
    return [
        Diagnosis(
            f"stage_imbalance:{job_id}",
            "stage_imbalance",
            "slowdown",
            0.9,
            f"pipeline stage {k} of {layout.pp} ({per_stage} ranks{role}) computes "
            f"{excess:.0%} longer than the other stages at every replica "
            f"(+{(mean[k] - median) * 1e3:.0f} ms a step): the layers are split unevenly "
            f"across the stages, not a slow worker. Balanced, the job would run "
            f"{speedup:.1%} faster ({share:.1%} of its step time goes to the imbalance); move "
            "layers off this stage (Megatron --decoder-first/last-pipeline-num-layers or "
            "--account-for-loss-in-pipeline-split, torchtitan pipeline_parallel_layers_per_stage)",
            step=tally.first + MIN_STEPS - 1,
            start_step=tally.first,
            end_step=tally.last,
            time=tally.start,
            ranks=ranks[:256],
            job_id=job_id,
            evidence=[
                {
                    "metric": "stage compute / the other stages' median",
                    "value": float(mean[k] / median),
                    "baseline": 1.0,
                    "stage": k,
                    "stages": [round(float(v), 6) for v in mean],
                    "seconds": round(float(mean[k] - median), 6),
                    "saved": round(tally.saved, 3),
                    "share": round(share, 4),
                    "speedup": round(speedup, 4),
                    "steps": tally.steps,
                }
            ],
        )
    ]


def batch_imbalance(
    tally: StageTally, layout: ParallelLayout, job_id: str, min_spread: float
) -> list[Diagnosis]:
    """The attempt's ``batch_imbalance`` finding when the replicas' batches vary by at least
    ``min_spread`` (0.03: 3%, a standard deviation) step to step, every stage of a replica
    alike (the module docstring)."""
    m = tally.moments
    if m.dof < MIN_BATCH_DOF or m.corr < MIN_BATCH_CORR or m.spread < min_spread:
        return []
    dp = layout.dp
    spread = m.spread * float(np.sqrt(dp / (dp - 1)))  # against the median of dp, not of all
    share = tally.batch_saved / tally.wall if tally.wall > 0 else 0.0
    speedup = (
        tally.batch_saved / (tally.wall - tally.batch_saved)
        if tally.wall > tally.batch_saved
        else 0.0
    )
    return [
        Diagnosis(
            f"batch_imbalance:{job_id}",
            "batch_imbalance",
            "slowdown",
            round(min(0.9, m.corr), 2),
            f"the {dp} data-parallel replicas' batches cost unevenly: a replica computes "
            f"{spread:.1%} longer or shorter than the others from one step to the next, at every "
            "pipeline stage alike, and which replica is slowest moves; every step waits for the "
            "heaviest batch. That is the data (sequence lengths, packing), not a worker. Even "
            f"batches, the job would run {speedup:.1%} faster ({share:.1%} of its step time); "
            "balance the tokens per replica (sequence packing, length-grouped sampling, a token "
            "budget per micro-batch)",
            step=tally.first + MIN_STEPS - 1,
            start_step=tally.first,
            end_step=tally.last,
            time=tally.start,
            ranks=[],
            job_id=job_id,
            evidence=[
                {
                    "metric": "replica batch cost spread (standard deviation)",
                    "value": round(spread, 4),
                    "baseline": 0.0,
                    "correlation": round(m.corr, 3),
                    "replicas": dp,
                    "saved": round(tally.batch_saved, 3),
                    "share": round(share, 4),
                    "speedup": round(speedup, 4),
                    "steps": tally.steps,
                }
            ],
        )
    ]


def fold_tp_groups(stragglers: list[Diagnosis], layout: ParallelLayout | None) -> list[Diagnosis]:
    """Straggler findings that cover every rank of one tensor-parallel group, of one kind, as
    one finding of the group. Its ranks all-reduce in every layer, so one slow GPU (or the
    group's NVLink) slows all of them alike: the group is one worker problem on its node, not
    ``tp`` of them. Moving stragglers and partial groups are left as they are."""
    if layout is None or layout.tp < 2 or len(stragglers) < layout.tp:
        return stragglers
    groups: dict[tuple[str, int, int, int], list[Diagnosis]] = {}
    for d in stragglers:
        if d.diagnosis == "straggler.moving" or len(d.ranks) != 1 or d.ranks[0] >= layout.world:
            continue
        c = layout.coords(d.ranks[0])
        groups.setdefault((d.diagnosis, c["pp"], c["dp"], c["cp"]), []).append(d)
    folded: set[int] = set()
    out: list[Diagnosis] = []
    for (diag, pp, dp, _cp), members in groups.items():
        if len({m.ranks[0] for m in members}) != layout.tp:
            continue
        members.sort(key=lambda m: m.ranks[0])
        ranks = [m.ranks[0] for m in members]
        first = members[0]
        ongoing = any(m.end_step < 0 for m in members)
        nodes = sorted({n for m in members for n in m.nodes})
        where = (
            f"ranks {ranks[0]}-{ranks[-1]}"
            if ranks == list(range(ranks[0], ranks[-1] + 1))
            else f"ranks {ranks}"
        )
        slow = [
            float(v)
            for m in members
            for e in m.evidence[:1]
            if isinstance(v := e.get("value"), (int, float))
        ]
        out.append(
            Diagnosis(
                f"{first.key}:tp-group",
                diag,
                "straggler",
                max(m.confidence for m in members),
                f"{diag.split('.')[-1]} straggler: the tensor-parallel group of {where} "
                f"(pipeline stage {pp}, data-parallel replica {dp}; {', '.join(nodes[:4])}) "
                f"{(max(slow) - 1.0) if slow else 0.0:.1%} slower than its stage: its ranks "
                "all-reduce in every layer, so one slow GPU or its NVLink slows the whole group; "
                "one worker problem, not several",
                step=min(m.step for m in members),
                start_step=min(m.start_step for m in members),
                end_step=-1 if ongoing else max(m.end_step for m in members),
                time=min((m.time for m in members if m.time is not None), default=None),
                ranks=ranks,
                nodes=nodes,
                gpus=sorted({g for m in members for g in m.gpus}),
                rack=first.rack,
                job_id=first.job_id,
                evidence=[
                    *first.evidence[:1],  # the slowdown first: it weighs the finding's cost
                    {"metric": "tensor-parallel group", "ranks": ranks, "stage": pp, "replica": dp},
                    *first.evidence[1:],
                    *(e for m in members[1:] for e in m.evidence[1:]),
                ],
            )
        )
        folded.update(id(m) for m in members)
    return [d for d in stragglers if id(d) not in folded] + out
