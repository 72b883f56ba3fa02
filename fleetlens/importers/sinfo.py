"""Slurm capacity: ``sinfo --Node`` output into one ``sched_pool`` row per partition.

Expected command (header line included, ``|``-separated, one line per node and partition)::

    sinfo --Node --format='%N|%P|%T|%G'

which prints ``NODELIST|PARTITION|STATE|GRES``. A partition's capacity is the GPUs of its nodes
(``gpu:8``, ``gpu:h100:8(S:0-1)``; several ``gpu`` entries add up); its in-service GPUs leave
out nodes that are down, drained or draining, failed, in maintenance, not responding (a ``*``
after the state) or invalid. Partitions without GPUs are left out. sinfo prints no time: the
row is dated ``time`` (the moment the command ran).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np

from ..errors import TraceFormatError
from . import PoolRows

__all__ = ["COMMAND", "OUT_OF_SERVICE", "parse_sinfo"]

COMMAND = "sinfo --Node --format='%N|%P|%T|%G'"
OUT_OF_SERVICE = ("down", "drain", "fail", "maint", "inval", "unknown", "future", "reboot")
"""Node states (prefixes of sinfo's long state names) whose GPUs are not in service."""

_GPU_RE = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")
_FIELDS = ("NODELIST", "PARTITION", "STATE", "GRES")


def _gpus(gres: str) -> int:
    return sum(int(n) for n in _GPU_RE.findall(gres.strip()))


def _in_service(state: str) -> bool:
    s = state.strip().lower()
    if s.endswith("*"):  # the node does not respond
        return False
    return not any(s.startswith(p) for p in OUT_OF_SERVICE)


def parse_sinfo(lines: Iterable[str], time: float) -> PoolRows:
    """Parse ``sinfo --Node --format='%N|%P|%T|%G'`` text (header first): GPUs per partition."""
    it = iter(lines)
    header = [h.strip() for h in next(it, "").rstrip("\n").split("|")]
    missing = [f for f in _FIELDS if f not in header]
    if missing:
        raise TraceFormatError(
            f"sinfo output lacks column(s) {', '.join(missing)} in its first line "
            f"{'|'.join(header)!r}; run it as {COMMAND} (with its header line)"
        )
    col = {name: header.index(name) for name in _FIELDS}
    cap: dict[str, list[int]] = {}
    for n, raw in enumerate(it, start=2):
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        f = line.split("|")
        if len(f) != len(header):
            raise TraceFormatError(
                f"sinfo line {n} has {len(f)} fields, the header {len(header)}: {line!r}"
            )
        node = f[col["NODELIST"]].strip()
        if "[" in node or "," in node:
            raise TraceFormatError(
                f"sinfo line {n}: NODELIST is the range {node!r}; run {COMMAND} (--Node prints "
                "one line per node, so each node's GPUs are counted once)"
            )
        pool = f[col["PARTITION"]].strip().rstrip("*")  # the default partition ends in '*'
        if not pool:
            raise TraceFormatError(f"sinfo line {n}: PARTITION is empty")
        gpus = _gpus(f[col["GRES"]])
        held = cap.setdefault(pool, [0, 0])
        held[0] += gpus
        if _in_service(f[col["STATE"]]):
            held[1] += gpus
    pools = sorted(p for p, (c, _) in cap.items() if c > 0)
    k = len(pools)
    return PoolRows(
        pool=np.array(pools, dtype=object),
        time=np.full(k, float(time), dtype=np.float64),
        capacity_gpus=np.array([cap[p][0] for p in pools], dtype=np.int32),
        in_service_gpus=np.array([cap[p][1] for p in pools], dtype=np.int32),
    )
