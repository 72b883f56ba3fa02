"""Fault kinds: what each one does to the job, who owns it, and how it ends an attempt.

A fault is resolved once per run into an :class:`Injected` with concrete targets. Hardware
faults belong to a physical GPU or node, so after a restart they follow the hardware (and vanish
when the node is replaced); data and code faults belong to ranks. Slowdowns act on a window of
global steps, so a replayed step sees the same slowdown it saw the first time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .model import FaultSpec, Scenario

__all__ = ["FAULT_KINDS", "FaultKind", "Injected", "chunk_effects", "resolve_faults"]

Arr = np.ndarray[Any, Any]


@dataclass(frozen=True)
class FaultKind:
    diagnosis: str
    owner: str
    mode: str  # slow | fatal | hang | preempt | drain | checkpoint
    magnitude: float = 0.0
    duration_steps: int = 0
    event: str = "failure"


FAULT_KINDS: dict[str, FaultKind] = {
    "straggler.persistent": FaultKind(
        "straggler.persistent", "infrastructure", "slow", 0.15, 10**9
    ),
    "straggler.intermittent": FaultKind(
        "straggler.intermittent", "infrastructure", "slow", 0.3, 600
    ),
    "straggler.moving": FaultKind("straggler.moving", "data_pipeline", "slow", 0.25, 600),
    "thermal": FaultKind("thermal", "infrastructure", "slow", 0.2, 400),
    "rack_cooling": FaultKind("rack_cooling", "infrastructure", "slow", 0.05, 500),
    "nvlink": FaultKind("nvlink", "infrastructure", "slow", 0.6, 400),
    "network": FaultKind("network", "network", "slow", 1.0, 300),
    "data_stall": FaultKind("data_stall", "data_pipeline", "slow", 0.6, 100),
    "ecc_xid": FaultKind("ecc_xid", "infrastructure", "fatal", 0.0, 300, "hardware_fault"),
    "fatal_xid": FaultKind("fatal_xid", "infrastructure", "fatal", 0.0, 0, "hardware_fault"),
    "instability": FaultKind("instability", "training_code", "fatal", 0.0, 30, "nan"),
    "oom": FaultKind("oom", "training_code", "fatal", 0.0, 0, "oom"),
    "crash": FaultKind("software_crash", "training_code", "fatal", 0.0, 0, "exception"),
    "network_down": FaultKind("network", "network", "fatal", 0.0, 0, "failure"),
    "host_failure": FaultKind("host", "host", "fatal", 0.0, 0, "failure"),
    "hang": FaultKind("hang", "training_code", "hang", 0.0, 0, "hang"),
    "preemption": FaultKind("preemption", "scheduler", "preempt", 0.0, 0, "preemption"),
    "maintenance": FaultKind("maintenance", "scheduler", "drain", 0.0, 0, "drain"),
    "slow_checkpoint": FaultKind("slow_checkpoint", "storage", "checkpoint", 5.0, 600),
}

_NODE_FAULTS = {"fatal_xid", "ecc_xid", "host_failure", "maintenance", "nvlink", "network_down"}
_GPU_FAULTS = {"straggler.persistent", "straggler.intermittent", "thermal", "ecc_xid", "fatal_xid"}


@dataclass
class Injected:
    """A fault with concrete targets; the engine fills in when and where it really happened."""

    id: str
    kind: str
    info: FaultKind
    start: int
    end: int  # exclusive; for terminating faults end == trigger
    magnitude: float
    ranks: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()  # physical GPU ids: node_index * gpus_per_node + gpu
    nodes: tuple[int, ...] = ()
    rack: int = -1
    params: dict[str, Any] = field(default_factory=dict)
    fired: bool = False
    start_time: float | None = None
    end_time: float | None = None
    job_ids: list[str] = field(default_factory=list)

    @property
    def trigger(self) -> int:
        return self.end if self.info.mode in ("fatal", "hang", "preempt", "drain") else -1


def resolve_faults(
    scn: Scenario, specs: list[FaultSpec], rng: np.random.Generator
) -> list[Injected]:
    """Give every fault a step window and a target, using the first attempt's placement."""
    gpn = scn.cluster.gpus_per_node
    world = scn.world_size
    nominal = scn.job.step_time
    out = []
    for i, f in enumerate(sorted(specs, key=lambda f: f.step if f.step >= 0 else f.at / nominal)):
        info = FAULT_KINDS[f.kind]
        start = f.step if f.step >= 0 else int(f.at / nominal)
        dur = f.duration_steps or info.duration_steps
        ranks = f.ranks or (int(rng.integers(world)),)
        node = f.node if f.node >= 0 else ranks[0] // gpn
        gpu = f.gpu if f.gpu >= 0 else ranks[0] % gpn
        inj = Injected(
            id=f"f{i:03d}-{f.kind}",
            kind=f.kind,
            info=info,
            start=start,
            end=start + dur,
            magnitude=f.magnitude or info.magnitude,
            params=dict(f.params),
        )
        if f.kind in _GPU_FAULTS:
            inj.gpus = (node * gpn + gpu,)
            inj.nodes = (node,)
            inj.ranks = (node * gpn + gpu,) if node * gpn + gpu < world else ()
        elif f.kind in _NODE_FAULTS:
            inj.nodes = (node,)
            inj.gpus = tuple(range(node * gpn, node * gpn + gpn))
            inj.ranks = tuple(r for r in inj.gpus if r < world)
        elif f.kind == "rack_cooling":
            npr = scn.cluster.nodes_per_rack
            inj.rack = f.rack if f.rack >= 0 else node // npr
            inj.nodes = tuple(range(inj.rack * npr, min(scn.cluster.nodes, (inj.rack + 1) * npr)))
            inj.gpus = tuple(g for n in inj.nodes for g in range(n * gpn, n * gpn + gpn))
            inj.ranks = tuple(r for r in inj.gpus if r < world)
        elif f.kind in (
            "network",
            "preemption",
            "slow_checkpoint",
            "instability",
            "straggler.moving",
        ):
            inj.ranks = tuple(range(world)) if f.kind != "straggler.moving" else ()
        else:  # data_stall, hang, oom, crash: rank-tied
            inj.ranks = ranks
        if f.kind in ("data_stall", "hang", "oom", "crash"):
            inj.nodes = tuple(sorted({r // gpn for r in inj.ranks}))
        out.append(inj)
    return out


def _window(f: Injected, steps: Arr) -> Arr:
    return (steps >= f.start) & (steps < f.end)


def chunk_effects(
    faults: list[Injected], steps: Arr, phys: Arr, step_time: float, seed: int
) -> tuple[Arr, Arr, Arr]:
    """Compute factor (K, W), network factor (K,) and extra data wait (K, W) for a chunk.

    ``phys`` maps each rank to its physical GPU id in the current attempt."""
    k, w = len(steps), len(phys)
    cf = np.ones((k, w))
    nf = np.ones(k)
    dwx = np.zeros((k, w))
    for f in faults:
        if f.info.mode != "slow" or f.end <= steps[0] or f.start > steps[-1]:
            continue
        act = _window(f, steps)
        m = f.magnitude
        if f.kind in ("network", "nvlink"):
            nf[act] *= 1.0 + m
            continue
        if f.kind == "straggler.moving":
            period = int(f.params.get("period", 50))
            slow_rank = ((steps // period) * 2654435761 + seed) % w
            rows = np.flatnonzero(act)
            cf[rows, slow_rank[rows]] *= 1.0 + m
            continue
        if f.kind == "data_stall":
            mask = np.isin(np.arange(w), f.ranks)
            dwx[np.ix_(act, mask)] += m * step_time
            continue
        mask = np.isin(phys, f.gpus)
        if not mask.any():
            continue
        factor = np.where(act, 1.0 + m, 1.0)
        if f.kind == "straggler.intermittent":
            period = int(f.params.get("period", 150))
            episode = int(f.params.get("episode", 40))
            factor = np.where(act & ((steps - f.start) % period < episode), 1.0 + m, 1.0)
        elif f.kind == "thermal":
            ramp = np.clip((steps - f.start + 1) / float(f.params.get("ramp_steps", 30)), 0, 1)
            factor = np.where(act, 1.0 + m * ramp, 1.0)
        cf[:, mask] *= factor[:, None]
    return cf, nf, dwx


def checkpoint_factor(faults: list[Injected], step: int) -> float:
    """How much longer the checkpoint written after ``step`` takes (slow storage)."""
    out = 1.0
    for f in faults:
        if f.info.mode == "checkpoint" and f.start <= step < f.end:
            out *= 1.0 + f.magnitude
    return out
