"""Slurm accounting records: ``sacct --parsable2`` output into scheduler allocations.

Expected command (header line included, ``|``-separated)::

    sacct --allocations --parsable2 \\
        --format=JobID,JobName,Partition,AllocTRES,Submit,Start,End,State,NNodes

Job steps (``123.batch``, ``123.0``, ``123.extern``) are skipped: the allocation is the job.
GPUs come from ``gres/gpu=N`` or ``gres/gpu:<type>=N`` in AllocTRES (0 when absent). Times are
Slurm's local ISO times without a zone; pass ``tz`` for the cluster's zone (default UTC).
``Unknown``/``None`` start or end become NaN (never started / still running). A job without
AllocTRES was never allocated anything: its start is NaN too (Slurm writes the cancel time as
the Start of a job cancelled while it waited). Slurm allocates a job's nodes atomically, so
``gang_complete`` is the start.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from datetime import datetime, timezone, tzinfo

import numpy as np

from ..errors import FleetlensError
from . import Allocations

__all__ = ["parse_sacct"]

_FIELDS = ("JobID", "JobName", "Partition", "AllocTRES", "Submit", "Start", "End", "State")
_GPU_RE = re.compile(r"gres/gpu(?::[^=,]+)?=(\d+)")


def _time(value: str, tz: tzinfo, line: int, name: str) -> float:
    v = value.strip()
    if v in ("", "Unknown", "None", "N/A"):
        return math.nan
    try:
        dt = datetime.fromisoformat(v)
    except ValueError:
        raise FleetlensError(
            f"sacct line {line}: {name} is {value!r}; expected an ISO time like "
            "2024-05-01T12:00:00 (run sacct without a custom SLURM_TIME_FORMAT)"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=tz)
    return dt.timestamp()


def _gpus(tres: str) -> int:
    # A typed and an untyped entry can both appear (gres/gpu=8,gres/gpu:h100=8): take the max.
    found = [int(m) for m in _GPU_RE.findall(tres)]
    return max(found) if found else 0


def parse_sacct(lines: Iterable[str], tz: tzinfo = timezone.utc) -> Allocations:
    """Parse ``sacct --parsable2`` text (header first) into allocations, one per job."""
    it = iter(lines)
    header = next(it, "").rstrip("\n").split("|")
    missing = [f for f in _FIELDS if f not in header]
    if missing:
        raise FleetlensError(
            f"sacct output lacks column(s) {', '.join(missing)}; run it with "
            "--parsable2 --format=JobID,JobName,Partition,AllocTRES,Submit,Start,End,State,NNodes"
        )
    col = {name: header.index(name) for name in header}
    rows: list[tuple[str, str, int, float, float, float, str]] = []
    for n, raw in enumerate(it, start=2):
        line = raw.rstrip("\n")
        if not line:
            continue
        f = line.split("|")
        if len(f) < len(header):
            raise FleetlensError(f"sacct line {n} has {len(f)} fields, the header {len(header)}")
        job = f[col["JobID"]]
        if "." in job:
            continue
        state = f[col["State"]].split(" ")[0]
        began = _time(f[col["Start"]], tz, n, "Start")
        if not f[col["AllocTRES"]].strip():
            began = math.nan
        rows.append(
            (
                f[col["Partition"]],
                job,
                _gpus(f[col["AllocTRES"]]),
                _time(f[col["Submit"]], tz, n, "Submit"),
                began,
                _time(f[col["End"]], tz, n, "End"),
                state,
            )
        )
    k = len(rows)
    gpus = np.array([r[2] for r in rows], dtype=np.int32)
    start = np.array([r[4] for r in rows], dtype=np.float64)
    return Allocations(
        pool=np.array([r[0] for r in rows], dtype=object),
        job_id=np.array([r[1] for r in rows], dtype=object),
        run_id=np.array([""] * k, dtype=object),
        gpus=gpus,
        gpu_share=gpus.astype(np.float64),
        submit=np.array([r[3] for r in rows], dtype=np.float64),
        start=start,
        gang_complete=start.copy(),
        end=np.array([r[5] for r in rows], dtype=np.float64),
        state=np.array([r[6] for r in rows], dtype=object),
    )
