"""Randomized scenarios for measuring detection beyond the shipped library.

``generate_fleets(seed, n)`` draws fleets: each a tenant whose runs follow one another on the
same nodes (node names are reused, so evidence of one run must not be charged to another; runs
of the same world size are the same workload, at the same step time), each run a
:class:`~fleetlens.sim.model.Scenario` with a random world size, step time, per-rank noise
(1-5 %) and length, healthy or with one to three faults at once: slowdowns with a random
magnitude (2-50 %, drawn evenly over the bins 2-5, 5-10, 10-20 and 20-50 %), onset and duration
on distinct nodes, and at most one fault that ends the attempt. The simulator injects them and
writes the ground truth (``simulate``); nothing here simulates anything. Same seed, same fleets.

What ``magnitude`` means follows the simulator (``faults.chunk_effects``): the compute
slowdown of the slow GPU(s) for stragglers, thermal and rack cooling (thermal ramps to it over
``ramp_steps``); the slowdown of the gradient transfer for network and NVLink (the transfer is
``comm_fraction`` of a step); the extra input wait, as a fraction of the step time, for a data
stall. Terminating faults (hang, Xids, OOM, NaN, preemption) have none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .model import Cluster, Emission, FaultSpec, Job, Noise, Pool, Scenario

__all__ = [
    "EVENT_KINDS",
    "MAGNITUDE_BINS",
    "SLOW_KINDS",
    "Fleet",
    "GenConfig",
    "generate_fleets",
    "magnitude_bin",
]

SLOW_KINDS = (
    "straggler.persistent", "straggler.intermittent", "straggler.moving", "thermal",
    "rack_cooling", "nvlink", "network", "data_stall",
)  # fmt: skip
EVENT_KINDS = ("hang", "fatal_xid", "ecc_xid", "oom", "instability", "preemption")
MAGNITUDE_BINS = ((0.02, 0.05), (0.05, 0.10), (0.10, 0.20), (0.20, 0.50))
# one fabric-wide slowdown per run: the simulator slows every rank's transfer for both
_JOB_WIDE = {"network", "nvlink", "straggler.moving"}


def magnitude_bin(m: float) -> str:
    """``"10-20%"`` for 0.15; ``""`` for a fault without a magnitude (0)."""
    for lo, hi in MAGNITUDE_BINS:
        if lo <= m < hi or (hi == MAGNITUDE_BINS[-1][1] and m == hi):
            return f"{lo * 100:g}-{hi * 100:g}%"
    return ""


@dataclass(frozen=True)
class GenConfig:
    runs_per_fleet: int = 4
    healthy_share: float = 0.25
    max_faults: int = 3
    event_share: float = 0.35  # chance that a faulty run also gets a terminating fault
    steps: tuple[int, int] = (240, 420)
    step_time: tuple[float, float] = (0.5, 2.0)
    noise: tuple[float, float] = (0.01, 0.05)
    nodes: tuple[int, int] = (2, 8)
    gpus_per_node: tuple[int, ...] = (4, 8)
    slow_kinds: tuple[str, ...] = SLOW_KINDS
    event_kinds: tuple[str, ...] = EVENT_KINDS
    start_time: float = 1.7e9


@dataclass(frozen=True)
class Fleet:
    """Runs that share one tenant and one set of node names, one after another in time."""

    name: str
    runs: tuple[Scenario, ...]


def _magnitude(rng: np.random.Generator) -> float:
    lo, hi = MAGNITUDE_BINS[int(rng.integers(len(MAGNITUDE_BINS)))]
    return round(float(rng.uniform(lo, hi)), 4)


def _slow(
    kind: str, rng: np.random.Generator, steps: int, node: int, gpn: int, npr: int
) -> FaultSpec:
    m = _magnitude(rng)
    onset = int(rng.integers(20, int(steps * 0.5)))
    left = steps - onset
    rank = node * gpn + int(rng.integers(gpn))
    params: dict[str, Any] = {}
    if kind == "straggler.persistent":
        return FaultSpec(kind, step=onset, ranks=(rank,), magnitude=m, duration_steps=10**9)
    if kind == "straggler.intermittent":
        period = int(rng.integers(40, 70))
        params = {"period": period, "episode": int(rng.integers(10, period // 2))}
        dur = max(3 * period, int(rng.uniform(0.6, 1.0) * left))
        return FaultSpec(
            kind, step=onset, ranks=(rank,), magnitude=m, duration_steps=dur, params=params
        )
    if kind == "straggler.moving":
        params = {"period": int(rng.integers(20, 50))}
        return FaultSpec(
            kind,
            step=onset,
            magnitude=m,
            params=params,
            duration_steps=int(rng.uniform(0.6, 1.0) * left),
        )
    if kind == "thermal":
        params = {"ramp_steps": int(rng.integers(5, 30))}
        return FaultSpec(
            kind,
            step=onset,
            ranks=(rank,),
            magnitude=m,
            params=params,
            duration_steps=int(rng.uniform(0.4, 1.0) * left),
        )
    if kind == "data_stall":
        k = int(rng.integers(1, gpn + 1))
        dur = int(rng.integers(30, max(31, left // 2)))
        return FaultSpec(
            kind,
            step=onset,
            ranks=tuple(range(node * gpn, node * gpn + k)),
            magnitude=m,
            duration_steps=dur,
        )
    if kind == "rack_cooling":
        return FaultSpec(
            kind,
            step=onset,
            rack=node // npr,
            magnitude=m,
            duration_steps=int(rng.uniform(0.4, 1.0) * left),
        )
    # network, nvlink
    return FaultSpec(
        kind, step=onset, node=node, magnitude=m, duration_steps=int(rng.uniform(0.3, 1.0) * left)
    )


def _event(kind: str, rng: np.random.Generator, steps: int, node: int, gpn: int) -> FaultSpec:
    step = int(rng.integers(int(steps * 0.4), int(steps * 0.8)))
    rank = node * gpn + int(rng.integers(gpn))
    if kind == "ecc_xid":  # single-bit errors rise for a while, then the double-bit error
        dur = int(rng.integers(10, 60))
        return FaultSpec(kind, step=step - dur, node=node, gpu=rank % gpn, duration_steps=dur)
    if kind == "fatal_xid":
        return FaultSpec(kind, step=step, node=node, gpu=rank % gpn)
    if kind == "instability":
        return FaultSpec(kind, step=step - 30, duration_steps=30)
    if kind == "preemption":
        return FaultSpec(kind, step=step)
    return FaultSpec(kind, step=step, ranks=(rank,))  # hang, oom


def _run(
    rng: np.random.Generator, cfg: GenConfig, name: str, start: float, workloads: dict[int, float]
) -> Scenario:
    gpn = int(rng.choice(cfg.gpus_per_node))
    nodes = int(rng.integers(cfg.nodes[0], cfg.nodes[1] + 1))
    steps = int(rng.integers(cfg.steps[0], cfg.steps[1] + 1))
    # The simulator sends no model config, so the server's workload signature (the key of its
    # healthy baselines) is the world size: runs of one world size are one workload, which runs
    # at one speed; another speed would rightly read as a regression.
    step_time = workloads.setdefault(nodes * gpn, round(float(rng.uniform(*cfg.step_time)), 3))
    npr = 4  # racks of 4 nodes, as the shipped scenarios
    faults: list[FaultSpec] = []
    if rng.random() >= cfg.healthy_share:
        free = [int(n) for n in rng.permutation(nodes)]  # every fault on its own node
        racks_used: set[int] = set()
        wide = False
        for _ in range(int(rng.integers(1, cfg.max_faults + 1))):
            kinds = [k for k in cfg.slow_kinds if not (wide and k in _JOB_WIDE)]
            if not free or not kinds:
                break
            kind = str(rng.choice(kinds))
            node = free.pop()
            if kind == "rack_cooling":  # the whole rack is hot: no other fault in it
                if node // npr in racks_used:
                    continue
                free = [n for n in free if n // npr != node // npr]
            racks_used.add(node // npr)
            wide |= kind in _JOB_WIDE
            faults.append(_slow(kind, rng, steps, node, gpn, npr))
        if free and cfg.event_kinds and rng.random() < cfg.event_share:
            kind = str(rng.choice(cfg.event_kinds))
            faults.append(_event(kind, rng, steps, free.pop(), gpn))
    return Scenario(
        name=name,
        description="generated",
        seed=int(rng.integers(2**31)),
        start_time=start,
        cluster=Cluster(
            nodes=nodes, gpus_per_node=gpn, nodes_per_rack=npr, nodes_per_switch=2, spare_nodes=2
        ),
        job=Job(
            run_id=name,
            steps=steps,
            step_time=step_time,
            checkpoint_every=100,
            checkpoint_write_s=5.0,
            startup_s=30.0,
            detect_s=30.0,
            restart_s=30.0,
            hang_timeout_s=max(120.0, 30 * step_time),
            preempt_wait_s=120.0,
            maintenance_s=120.0,
        ),
        noise=Noise(rank_cov=round(float(rng.uniform(*cfg.noise)), 4)),
        pool=Pool(other_jobs=2, partial_gangs=0),
        emission=Emission(collective_every=10, sample_s=10.0),
        faults=tuple(faults),
    )


def _span(scn: Scenario) -> float:
    """A bound on the run's wall clock (steps, checkpoints, restarts, waits), so the next run
    on the same nodes starts after it."""
    j = scn.job
    steps = j.steps * j.step_time * 2.0 + j.steps // j.checkpoint_every * j.checkpoint_write_s
    waits = j.startup_s + j.hang_timeout_s + j.preempt_wait_s + 2 * (j.detect_s + j.restart_s)
    return steps + waits + 100 * j.step_time


def generate_fleets(seed: int, n: int, cfg: GenConfig = GenConfig()) -> list[Fleet]:
    """``n`` fleets of ``cfg.runs_per_fleet`` runs each; reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        # fleets are tenants of their own, so they may share the calendar (and stay in the
        # past: the collector refuses records far ahead of its clock)
        t = cfg.start_time + i * 3600.0
        runs: list[Scenario] = []
        workloads: dict[int, float] = {}
        for k in range(cfg.runs_per_fleet):
            scn = _run(rng, cfg, f"gen-{seed}-{i:04d}-r{k}", t, workloads)
            runs.append(scn)
            t += _span(scn) + float(rng.uniform(60.0, 3600.0))
        out.append(Fleet(f"gen-{seed}-{i:04d}", tuple(runs)))
    return out
