"""One chunk of synchronous data-parallel steps, vectorized over (steps x ranks).

Each rank waits for its input (``data_wait``), computes (forward, backward, optimizer: its own
time), then enters the gradient collective. The collective ends for everybody at the same
moment: the last rank's arrival plus the network transfer. So a rank's ``comm`` is its wait plus
the transfer, every rank's ``duration`` is (nearly) the same, and the straggler is the rank with
the largest compute and the smallest ``comm``. The job's step time is the slowest rank's.

Each step's time is split the way the goodput breakdown splits a measured step (the shared
definitions, docs/goodput.md): ``data_stall`` is the longest input wait of any rank,
``straggler`` the slowest rank's compute less the mean rank's (what the others waited for it at
the collective, healthy noise included) and ``productive`` the rest. The healthy counterfactual
(same noise, no faults) is computed beside the real one, so the step time the faults *added*
is known exactly too (``injected_straggler``, ``injected_data_stall``): ground truth, not an
estimate.

A pipeline job's stages may do unequal work (``Job.stage_work``; ranks are stage-major, the
stage of rank r is ``r // (world / pp)``). Every stage waits for the slowest in the pipeline's
steady state, which the step's last arrival stands for here (the schedule's bubbles are not
modelled). ``injected_stage`` is what the imbalance costs: the step time less the step time
with the slowest stage's work set to its peers' median (so the next slowest stage sets the pace),
the same noise, no faults: the what-if the analysis estimates. A replica's batch may cost more or
less from step to step (``Job.batch_cov``: every stage of it alike, a new draw each step);
``injected_batch`` is the step time less the step time with every batch at the median cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .model import Job, Noise

__all__ = ["PHASE_SPLIT", "StepChunk", "simulate_chunk", "stage_work"]

Arr = np.ndarray[Any, Any]

PHASE_SPLIT = (0.32, 0.62, 0.06)
"""Forward, backward and optimizer shares of compute (a dense transformer, roughly 1:2)."""


@dataclass
class StepChunk:
    steps: Arr  # (K,)
    starts: Arr  # (K,) step start times
    step_time: Arr  # (K,) job step time (slowest rank + transfer)
    data_wait: Arr  # (K, W)
    compute: Arr  # (K, W)
    comm: Arr  # (K, W)
    duration: Arr  # (K, W)
    arrive: Arr  # (K, W) offset of each rank's collective entry from the step start
    productive: float
    straggler: float
    data_stall: float
    injected_straggler: float
    injected_data_stall: float
    injected_stage: float = 0.0
    injected_batch: float = 0.0

    @property
    def end(self) -> float:
        return float(self.starts[-1] + self.step_time[-1])


def simulate_chunk(
    steps: Arr,
    t0: float,
    job: Job,
    noise: Noise,
    offsets: Arr,
    effects: tuple[Arr, Arr, Arr],
    rng: np.random.Generator,
) -> StepChunk:
    """Simulate steps ``steps`` starting at ``t0``; ``offsets`` is each rank's persistent bias."""
    k, w = len(steps), len(offsets)
    cf, nf, dwx = effects
    compute_s = job.step_time * (1.0 - job.comm_fraction - job.data_wait_fraction)
    common = 1.0 + noise.step_cov * rng.standard_normal((k, 1))
    comp_h = rng.standard_normal((k, w))
    comp_h *= noise.rank_cov
    comp_h += 1.0
    comp_h *= common
    comp_h *= compute_s * (1.0 + offsets)[None, :]
    work, balanced = stage_work(job, w)
    comp_h *= work[None, :]
    batch = np.ones((1, w))
    if job.batch_cov > 0:  # each replica's batch, at every stage: moves between replicas
        per_stage = max(w // max(job.pp, 1), 1)
        replica = (np.arange(w) % per_stage) // max(min(job.tp, per_stage), 1)
        draw = np.clip(
            1.0 + job.batch_cov * rng.standard_normal((k, int(replica.max()) + 1)), 0.5, None
        )
        batch = draw[:, replica]
        comp_h *= batch
    dw_h = rng.exponential(job.data_wait_fraction * job.step_time, size=(k, w))
    net_h = job.step_time * job.comm_fraction * common[:, 0]
    arrive_h = dw_h + comp_h
    t_h = arrive_h.max(axis=1) + net_h
    t_bal = (dw_h + comp_h / work[None, :] * balanced[None, :]).max(axis=1) + net_h
    t_even = (dw_h + comp_h / batch).max(axis=1) + net_h
    comp = comp_h * cf
    net = net_h * nf
    t_s = (dw_h + comp).max(axis=1) + net
    dw = dw_h + dwx
    arrive = dw + comp
    t_real = arrive.max(axis=1) + net
    # ranks leave the collective within tens of microseconds of each other
    leave = t_real[:, None] + np.abs(rng.standard_normal((k, w))) * 2e-5
    starts = t0 + np.concatenate(([0.0], np.cumsum(t_real[:-1])))
    stall = np.minimum(dw.max(axis=1), t_real)
    wait = np.clip(comp.max(axis=1) - comp.mean(axis=1), 0.0, t_real - stall)
    return StepChunk(
        steps=steps,
        starts=starts,
        step_time=t_real,
        data_wait=dw,
        compute=comp,
        comm=leave - arrive,
        duration=leave,
        arrive=arrive,
        productive=float((t_real - stall - wait).sum()),
        straggler=float(wait.sum()),
        data_stall=float(stall.sum()),
        injected_straggler=float((t_s - t_h).sum()),
        injected_data_stall=float((t_real - t_s).sum()),
        injected_stage=float((t_h - t_bal).sum()),
        injected_batch=float((t_h - t_even).sum()),
    )


def stage_work(job: Job, world: int) -> tuple[Arr, Arr]:
    """Each rank's work factor, and the same with the slowest stage's set to the other stages'
    median: the balanced what-if."""
    if not job.stage_work or job.pp < 2:
        return np.ones(world), np.ones(world)
    stage = np.arange(world) // max(world // job.pp, 1)
    per = np.asarray(job.stage_work, dtype=float)
    ideal = per.copy()
    top = int(np.argmax(per))
    ideal[top] = float(np.median(np.delete(per, top)))
    return per[stage], ideal[stage]
