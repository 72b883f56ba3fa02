"""The Alibaba GPU cluster trace 2023 (``openb``, Weng et al., USENIX ATC'23) as allocations.

``openb_pod_list_*.csv``: one row per pod with ``num_gpu``, ``gpu_milli`` (the share of one GPU
a GPU-sharing pod asks for, in thousandths; 1000 for whole GPUs), ``creation_time``,
``scheduled_time`` (empty if never scheduled) and ``deletion_time``, in seconds from the
trace's origin. ``openb_node_list_gpu_node.csv``: the GPU nodes and their GPU counts.

Assumptions (see docs/goodput.md): a pod is a gang of one (all its GPUs are on one node and are
bound at once, so gang complete = scheduled); a pod holds ``num_gpu x gpu_milli / 1000`` GPUs
(``gpu_share``); CPU-only pods are dropped; the node list is the pool, all in service for the
whole trace (the trace records no outages); ``epoch`` shifts trace seconds to UNIX time.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable

import numpy as np

from ..errors import FleetlensError
from . import Allocations, PoolRows

__all__ = ["parse_nodes", "parse_pods"]

_POD_COLS = ("name", "num_gpu", "gpu_milli", "creation_time", "deletion_time", "scheduled_time")


def _f(v: str) -> float:
    v = v.strip()
    return float(v) if v else math.nan


def parse_pods(
    lines: Iterable[str], pool: str = "openb", epoch: float = 0.0, gpu_only: bool = True
) -> Allocations:
    reader = csv.DictReader(lines)
    missing = [c for c in _POD_COLS if c not in (reader.fieldnames or [])]
    if missing:
        raise FleetlensError(f"pod list lacks column(s) {', '.join(missing)}")
    names, gpus, share, sub, sch, dele, phase = [], [], [], [], [], [], []
    for n, r in enumerate(reader, start=2):
        try:
            g = int(r["num_gpu"] or 0)
            milli = int(r["gpu_milli"] or 0)
        except ValueError:
            raise FleetlensError(f"pod list line {n}: num_gpu/gpu_milli not integers") from None
        if gpu_only and g == 0:
            continue
        names.append(r["name"])
        gpus.append(g)
        share.append(g * (milli / 1000.0 if milli else 1.0))
        sub.append(_f(r["creation_time"]) + epoch)
        sch.append(_f(r["scheduled_time"]) + epoch)
        dele.append(_f(r["deletion_time"]) + epoch)
        phase.append(r.get("pod_phase", ""))
    start = np.array(sch, dtype=np.float64)
    k = len(names)
    return Allocations(
        pool=np.array([pool] * k, dtype=object),
        job_id=np.array(names, dtype=object),
        run_id=np.array([""] * k, dtype=object),
        gpus=np.array(gpus, dtype=np.int32),
        gpu_share=np.array(share, dtype=np.float64),
        submit=np.array(sub, dtype=np.float64),
        start=start,
        gang_complete=start.copy(),
        end=np.array(dele, dtype=np.float64),
        state=np.array(phase, dtype=object),
    )


def parse_nodes(lines: Iterable[str], pool: str = "openb", time: float = 0.0) -> PoolRows:
    """One ``sched_pool`` row: the GPUs installed on the listed nodes, all in service."""
    reader = csv.DictReader(lines)
    if "gpu" not in (reader.fieldnames or []):
        raise FleetlensError("node list lacks the `gpu` column")
    total = sum(int(r["gpu"] or 0) for r in reader)
    return PoolRows(
        pool=np.array([pool], dtype=object),
        time=np.array([time], dtype=np.float64),
        capacity_gpus=np.array([total], dtype=np.int32),
        in_service_gpus=np.array([total], dtype=np.int32),
    )
