"""What-if: how much faster a job would be with a worker, a stage or an operation type at its
peers' median (issue 33 item 3), after "Understanding Stragglers in Large Model Training Using
What-if Analysis" (OSDI 2025).

The step's dependency model is the synchronous one the measurements show: every rank waits
for its input (``data_wait``), computes, and enters the data-parallel collective; the step
ends at the last arrival plus the transfer (``T = max_r(data_wait + compute) + transfer``, the
transfer being what is left of the measured step once the last rank arrived). In a pipeline job
every stage waits for the slowest in the steady state, which the last arrival stands for; the
schedule's bubbles are not modelled. A what-if replaces durations and replays the step:

- a **worker** ideal: its compute at the (lower) median of its stage's ranks that step (its
  peers; of two, the faster);
- **every worker** ideal (compute): every rank at its stage's median;
- **stages** balanced: the slowest stage's ranks at the other stages' median (the next slowest
  stage then sets the pace);
- **data**: every rank's input wait at the step's median wait;
- **data-parallel communication**: the transfer at its median over the steps;
- **batches** (a pipeline job with two replicas or more): every rank's compute divided by its
  replica's batch factor that step (:func:`batch_factor`), the part of a replica's excess that
  its two halves of stages share, step by step: what uneven batches (sequence lengths) cost.

``S`` is the saving with all of them at once over the time left, ``saved / (wall - saved)``:
how much faster the job would run. The savings per type are each alone, so they need not add
up to the whole (the paper's per-type figures do not either); the savings per finding are each
finding's ranks (or stage) alone over the finding's steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .nanstats import nanlowmedian, nanmedian

__all__ = [
    "BatchMoments",
    "StepWhatIf",
    "Target",
    "batch_factor",
    "batch_moments",
    "replica_excess",
    "stage_scale",
    "stage_times",
    "step_whatif",
]

Arr = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Target:
    """What one finding would make ideal: ``ranks`` (workers) or ``stage`` (>= 0), over steps
    ``start``..``end`` (``end`` -1: to the last)."""

    key: str
    ranks: tuple[int, ...] = ()
    stage: int = -1
    start: int = 0
    end: int = -1
    batches: bool = False  # the replicas' batches evened out (a data-balance finding)


@dataclass(frozen=True)
class StepWhatIf:
    steps: int
    wall: float  # seconds: the steps' measured time
    saved: float  # every type ideal at once
    by_type: dict[str, float]  # seconds saved with that type alone ideal
    by_target: dict[str, float]  # seconds saved with that finding's workers or stage ideal

    @property
    def slowdown(self) -> float:
        """``S``: how much longer the job ran than with everything at its peers' median."""
        return self.saved / (self.wall - self.saved) if self.wall > self.saved else 0.0


def stage_times(c: Arr, stages: Arr, pp: int) -> Arr:
    """Steps x stages: each stage's lower median compute per step (of two ranks the faster, so
    one slow worker does not set its stage's time)."""
    with np.errstate(all="ignore"):
        return np.stack([nanlowmedian(c[:, stages == s]) for s in range(pp)], axis=1)


def stage_scale(per: Arr, stages: Arr) -> Arr:
    """Steps x ranks: the factor that brings the slowest stage's ranks to the next slowest
    stage's time, 1 elsewhere (``per``: each stage's time per step, steps x stages)."""
    top = np.argmax(np.nan_to_num(per, nan=-np.inf), axis=1)
    cap = np.sort(per, axis=1)[:, -2]  # the next slowest stage sets the pace
    k = np.arange(len(per))
    factor = np.where(per[k, top] > 0, np.minimum(cap / per[k, top], 1.0), 1.0)
    heavy = stages[None, :] == top[:, None]
    return np.where(heavy, factor[:, None], 1.0)


def replica_excess(c: Arr, stages: Arr, replicas: Arr, pp: int) -> tuple[Arr, Arr] | None:
    """Steps x replicas, twice: how much longer each data-parallel replica computes than the
    replicas' median, over the first half of the stages (``a``) and over the second (``b``): the
    median over the replica's ranks of those stages of compute over their stage's lower median
    that step. A batch that costs more (longer sequences) shows in both halves alike; a rank's
    noise or a slow worker in one. None without two stages and two replicas."""
    n = c.shape[1]
    st, rep = stages[:n], replicas[:n]
    dp = int(rep.max(initial=-1)) + 1
    if pp < 2 or dp < 2:
        return None
    with np.errstate(all="ignore"):
        per = stage_times(c, st, pp)
        x = c / per[:, np.clip(st, 0, None)]
        out = []
        for upper in (False, True):
            cols = np.flatnonzero((st >= 0) & ((st >= (pp + 1) // 2) == upper))
            cols = cols[np.argsort(rep[cols], kind="stable")]
            if len(cols) % dp or (np.bincount(rep[cols], minlength=dp) != len(cols) // dp).any():
                return None  # the layout does not place these ranks evenly
            half = nanmedian(x[:, cols].reshape(len(x), dp, -1), axis=2)
            out.append(half / nanmedian(half, axis=1)[:, None] - 1.0)
    return out[0], out[1]


@dataclass(frozen=True)
class BatchMoments:
    """Sums over (step, replica) of the halves' excesses less each replica's mean over its block
    (what persists, a slow worker or replica, is left out; what moves stays): ``ab`` their
    co-variation, ``aa`` and ``bb`` each one's, over ``dof`` degrees of freedom."""

    dof: float = 0.0
    ab: float = 0.0
    aa: float = 0.0
    bb: float = 0.0

    def __add__(self, o: BatchMoments) -> BatchMoments:
        return BatchMoments(self.dof + o.dof, self.ab + o.ab, self.aa + o.aa, self.bb + o.bb)

    @property
    def spread(self) -> float:
        """The replicas' batch cost's step-to-step spread (a standard deviation, as a fraction
        of the compute): the root of what the two halves share."""
        return float(np.sqrt(max(self.ab, 0.0) / self.dof)) if self.dof > 0 else 0.0

    @property
    def corr(self) -> float:
        d = np.sqrt(self.aa * self.bb)
        return float(self.ab / d) if d > 0 else 0.0

    @property
    def weight(self) -> float:
        """The share of a replica's mean excess (of its two halves) that is its batch's: the
        shared variation over the mean's whole variation (0 with no sharing)."""
        var_m = (self.aa + self.bb + 2.0 * self.ab) / 4.0
        return float(np.clip(self.ab / var_m, 0.0, 1.0)) if var_m > 0 else 0.0


def batch_moments(a: Arr, b: Arr, blocks: Arr) -> BatchMoments:
    """:class:`BatchMoments` of ``a`` and ``b`` (steps x replicas, :func:`replica_excess`),
    each replica's mean taken over each block of steps (``blocks``: a block id per step)."""
    ok = np.isfinite(a).all(axis=1) & np.isfinite(b).all(axis=1)
    a, b, blocks = a[ok], b[ok], blocks[ok]
    total = BatchMoments()
    for blk in np.unique(blocks):
        rows = blocks == blk
        if rows.sum() < 2:
            continue
        ra = a[rows] - a[rows].mean(axis=0)
        rb = b[rows] - b[rows].mean(axis=0)
        dof = float((rows.sum() - 1) * a.shape[1])
        total += BatchMoments(
            dof, float((ra * rb).sum()), float((ra**2).sum()), float((rb**2).sum())
        )
    return total


def batch_factor(a: Arr, b: Arr, replicas: Arr, weight: float) -> Arr:
    """Steps x ranks: each rank's replica's batch factor that step, ``1 + weight x`` the mean of
    its halves' excesses (1 for ranks past the layout and steps not measured)."""
    m = np.nan_to_num((a + b) / 2.0)
    f = 1.0 + weight * m[:, np.clip(replicas, 0, None)]
    f[:, replicas < 0] = 1.0
    return np.clip(f, 0.5, None)


def _balanced(c: Arr, stages: Arr | None) -> tuple[Arr, Arr]:
    """(every rank at its stage's lower median, per step; :func:`stage_scale`), both steps x
    ranks."""
    if stages is None or stages.max(initial=0) < 1:
        med = nanlowmedian(c)
        return np.broadcast_to(med[:, None], c.shape).copy(), np.ones_like(c)
    ideal = np.empty_like(c)
    pp = int(stages.max()) + 1
    per = stage_times(c, stages, pp)
    for s in range(pp):
        ideal[:, stages == s] = per[:, s : s + 1]
    return ideal, stage_scale(per, stages)


def step_whatif(
    steps: Arr,
    compute: Arr,
    data_wait: Arr,
    step_time: Arr,
    stages: Arr | None,
    targets: Sequence[Target] = (),
    replicas: Arr | None = None,
) -> StepWhatIf:
    """The what-if of the module docstring over ``steps`` (``compute``/``data_wait`` steps x
    ranks, seconds, NaN where a rank did not report; ``step_time`` per step; ``stages`` and
    ``replicas`` each rank's pipeline stage and data-parallel replica, or None)."""
    ok = np.isfinite(step_time) & np.isfinite(compute).any(axis=1)
    steps, c, step_time = steps[ok], compute[ok], step_time[ok]
    dw = np.nan_to_num(data_wait[ok], nan=0.0)
    if not len(steps):
        return StepWhatIf(0, 0.0, 0.0, {}, {})
    st = None if stages is None else stages[: c.shape[1]]
    with np.errstate(all="ignore"):
        c = np.where(np.isfinite(c), c, nanmedian(c, axis=1)[:, None])
        arrive = np.nanmax(dw + c, axis=1)
        transfer = np.clip(step_time - arrive, 0.0, None)
        ideal, scale = _balanced(c, st)
        dw_med = np.broadcast_to(np.median(dw, axis=1)[:, None], dw.shape)
        tr_med = np.minimum(transfer, np.median(transfer))

        def t(cc: Arr, ww: Arr, tr: Arr) -> Arr:
            return np.asarray(np.max(ww + cc, axis=1) + tr)

        base = t(c, dw, transfer)  # the model's step: the measured one, the transfer its rest
        by_type = {
            "compute": float(np.sum(base - t(ideal, dw, transfer))),
            "data": float(np.sum(base - t(c, dw_med, transfer))),
            "dp_comm": float(np.sum(base - t(c, dw, tr_med))),
        }
        if st is not None and st.max(initial=0) >= 1:
            by_type["stages"] = float(np.sum(base - t(c * scale, dw, transfer)))
        even = _even_batches(c, st, replicas)
        if even is not None:
            by_type["batches"] = float(np.sum(base - t(c / even, dw, transfer)))
        every = t(np.minimum(c, ideal) * scale, dw_med, tr_med)
        saved = float(np.sum(base - np.minimum(base, every)))
        by_target: dict[str, float] = {}
        for g in targets:
            rows = (steps >= g.start) & ((steps <= g.end) if g.end >= 0 else True)
            if not rows.any():
                by_target[g.key] = 0.0
                continue
            cc = c[rows].copy()
            if g.stage >= 0 and st is not None:
                cols = st == g.stage
                cc[:, cols] *= scale[rows][:, cols]
            if g.batches and even is not None:
                cc /= even[rows]
            cols_r = [r for r in g.ranks if r < cc.shape[1]]
            cc[:, cols_r] = np.minimum(cc[:, cols_r], ideal[rows][:, cols_r])
            by_target[g.key] = float(np.sum(base[rows] - t(cc, dw[rows], transfer[rows])))
    return StepWhatIf(len(steps), float(step_time.sum()), saved, by_type, by_target)


def _even_batches(c: Arr, stages: Arr | None, replicas: Arr | None) -> Arr | None:
    """Steps x ranks: the batch factor of each rank's replica over the whole window (the
    replicas' means over the window left out), or None without two stages and two replicas."""
    if stages is None or replicas is None:
        return None
    pp = int(stages.max(initial=0)) + 1
    halves = replica_excess(c, stages, replicas[: c.shape[1]], pp)
    if halves is None:
        return None
    a, b = halves
    w = batch_moments(a, b, np.zeros(len(a), dtype=np.int64)).weight
    return batch_factor(a, b, replicas[: c.shape[1]], w)
