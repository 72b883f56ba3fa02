"""The measurement contract of a speed answer (seed 003 s9.3.1): what a goodput, MFU or step time
was measured on, so that two answers are compared only when they were measured alike, or with
the difference said.

Three parts: the software the ranks reported at their start (framework, CUDA, NCCL, driver,
Python, compiler; a key with several values across the ranks is ``mixed``), the topology the
job was placed on (nodes, GPUs per node, devices, and the interconnect where the placement names
NVLink domains), and, when the same workload (:func:`fleetlens.analysis.baseline.
workload_signature`: the config keys that set the step time, and the world size) ran several
times in the project, the spread of the trials' median step times (their coefficient of
variation): a difference smaller than it is noise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "SOFTWARE_KEYS",
    "SOFTWARE_NAMES",
    "Contract",
    "Topology",
    "Trials",
    "differences",
    "software",
    "topology",
    "trials",
]

SOFTWARE_KEYS = ("image", "torch", "cuda", "nccl", "nvidia_driver", "python", "compiler")
"""The job_start ``environment`` keys that are part of the contract, in the order they are said."""

SOFTWARE_NAMES = {
    "image": "image",
    "torch": "torch",
    "cuda": "CUDA",
    "nccl": "NCCL",
    "nvidia_driver": "driver",
    "python": "Python",
    "compiler": "compiler",
}


@dataclass(frozen=True)
class Topology:
    nodes: int
    gpus_per_node: int  # the most ranks placed on one node
    devices: int
    interconnect: str | None  # "NVLink domains of 8 GPUs"; None where the placement names none
    gpus: bool = True  # False: the ranks were placed on no GPU (a CPU job): they are processes


@dataclass(frozen=True)
class Trials:
    """Runs of the same workload in the project (this one included), their median step times
    and the spread of those (standard deviation over mean)."""

    runs: list[str]
    step_time_median_s: list[float]
    spread: float | None  # None with fewer than two trials


@dataclass(frozen=True)
class Contract:
    software: dict[str, str]  # each key's value (the most common where mixed)
    mixed: dict[str, list[str]]  # keys whose ranks reported different values
    topology: Topology | None
    trials: Trials | None

    def text(self) -> str:
        """``torch 2.13.0, CUDA 12.4, NCCL 2.21.5 on 2 nodes x 8 GPUs (NVLink domains of 8
        GPUs); 3 trials, step time spread 1.2%``."""
        parts = [
            f"{SOFTWARE_NAMES[k]} {v}" + (" (mixed)" if k in self.mixed else "")
            for k, v in self.software.items()
            if k != "python"
        ]
        s = ", ".join(parts) or "software unknown"
        t = self.topology
        if t is not None:
            plural = "s" if t.gpus_per_node != 1 else ""
            unit = f"GPU{plural}" if t.gpus else f"rank{plural} on CPU"
            s += f" on {t.nodes} node{'s' if t.nodes != 1 else ''} x {t.gpus_per_node} {unit}"
            s += f" ({t.interconnect})" if t.interconnect else ""
        if self.trials is not None and self.trials.spread is not None:
            n, spread = len(self.trials.runs), self.trials.spread
            s += f"; {n} trials, step time spread {100 * spread:.1f}%"
        return s


def software(envs: Sequence[Mapping[str, Any]]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The contract's software from each rank's reported environment: each key's most common
    value, and the keys whose ranks disagree with all their values."""
    out: dict[str, str] = {}
    mixed: dict[str, list[str]] = {}
    for key in SOFTWARE_KEYS:
        seen = Counter(str(e[key]) for e in envs if e.get(key) not in (None, ""))
        if not seen:
            continue
        out[key] = seen.most_common(1)[0][0]
        if len(seen) > 1:
            mixed[key] = sorted(seen)
    return out, mixed


def topology(nodes: Sequence[str], gpus: Sequence[int], domains: Sequence[str]) -> Topology | None:
    """The placement of a job's ranks (each rank's node, GPU index (-1: none) and NVLink
    domain, "" where unknown)."""
    placed = [n for n in nodes if n]
    if not placed:
        return None
    per_node = Counter(placed)
    named = Counter(d for d in domains if d)
    most = max(named.values()) if named else 0
    link = f"NVLink domains of {most} GPU{'s' if most != 1 else ''}" if named else None
    on_gpu = any(int(g) >= 0 for g in gpus)
    return Topology(len(per_node), max(per_node.values()), len(placed), link, on_gpu)


def trials(runs: Sequence[str], medians: Sequence[float]) -> Trials | None:
    """The trials of one workload from their median step times; None for none."""
    if not runs:
        return None
    m = np.asarray(medians, dtype=np.float64)
    spread = float(m.std() / m.mean()) if len(m) >= 2 and m.mean() > 0 else None
    return Trials(list(runs), [float(x) for x in m], spread)


def differences(a: Contract, b: Contract) -> list[str]:
    """What differs between two contracts, said: ``torch 2.3.0 vs 2.4.0``, ``nodes 2 vs 4``."""
    out = []
    for key in SOFTWARE_KEYS:
        va, vb = a.software.get(key), b.software.get(key)
        if va != vb and va is not None and vb is not None:
            out.append(f"{SOFTWARE_NAMES[key]} {va} vs {vb}")
    ta, tb = a.topology, b.topology
    if ta is not None and tb is not None:
        pairs: list[tuple[str, Any, Any]] = [
            ("nodes", ta.nodes, tb.nodes),
            ("GPUs per node", ta.gpus_per_node, tb.gpus_per_node),
            ("interconnect", ta.interconnect, tb.interconnect),
        ]
        for name, x, y in pairs:
            if x != y and x is not None and y is not None:
                out.append(f"{name} {x} vs {y}")
    return out
