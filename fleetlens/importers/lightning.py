"""PyTorch Lightning ``CSVLogger`` metrics (``metrics.csv``) -> an :class:`ImportedRun`.

Lightning writes one row per logging call, with ``epoch``, ``step`` and a column per metric,
empty where that call did not log it. Losses become ``loss`` / ``val_loss``, ``lr-<Optimizer>``
becomes ``lr``; other columns keep their names. The file has no clock unless a ``time`` or
``timestamp`` column (UNIX seconds) was logged: then steps get their times and durations (the
time between logged steps over the steps between them); otherwise only the scalars are imported
(``clock == "synthetic"``: one second per step from ``start``), and goodput has no timeline.
"""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path

from ..errors import ConfigError
from .episodes import settle
from .runlog import Attempt, ImportedRun

__all__ = ["metric_name", "read_lightning"]


def metric_name(column: str) -> str:
    c = column.strip()
    low = c.lower().replace("/", "_")
    if low.startswith("lr-") or low in ("lr", "learning_rate"):
        return "lr"
    if low in ("train_loss", "train_loss_step", "loss", "loss_step"):
        return "loss"
    if low in ("val_loss", "valid_loss", "validation_loss", "val_loss_epoch"):
        return "val_loss"
    return low


def read_lightning(path: str | Path, *, start: float = 1.7e9, job_id: str = "a0") -> ImportedRun:
    p = Path(path)
    try:
        with open(p, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc}") from exc
    if not rows or "step" not in rows[0]:
        raise ConfigError(f"{p}: not a Lightning metrics.csv (no 'step' column)")
    clock_col = next((c for c in ("time", "timestamp") if c in rows[0]), None)
    run = ImportedRun(source="lightning", path=str(p), clock="log" if clock_col else "synthetic")
    a = Attempt(job_id=job_id, start=start)
    logged: dict[int, float] = {}
    for r in rows:
        try:
            step = int(float(r["step"]))
        except (TypeError, ValueError):
            continue
        for col, raw in r.items():
            if col in ("step", "epoch", clock_col) or raw in ("", None):
                continue
            try:
                v = float(raw)
            except ValueError:
                continue
            a.scalar(metric_name(col), step, v)
        if clock_col and r.get(clock_col):
            logged.setdefault(step, float(r[clock_col]))
    if clock_col and len(logged) >= 2:
        pts = sorted(logged.items())
        a.start = pts[0][1]
        for (s0, t0), (s1, t1) in itertools.pairwise(pts):
            dur = (t1 - t0) / max(1, s1 - s0)
            for k, s in enumerate(range(s0, s1)):
                a.steps.append(s)
                a.times.append(t0 + k * dur)
                a.durations.append(dur)
                a.tokens.append(0)
    else:
        run.notes.append("no clock in the file: scalars only, at start + step seconds")
        a.start = start
    a.event(a.start, "job_start", 0, "imported from Lightning")
    ep = [float(r["epoch"]) for r in rows if r.get("epoch") not in ("", None)]
    if ep and not math.isnan(max(ep)):
        run.config["epochs_seen"] = int(max(ep)) + 1
    run.attempts.append(a)
    return settle(run)
