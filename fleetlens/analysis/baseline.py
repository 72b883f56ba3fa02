"""Absolute baselines: is this job slower than healthy runs of the same workload were?

The peer-relative check (:mod:`.ranks`) cannot see a slowdown that all ranks share, or one a
large group shares (a rack, a pool throttling together moves the median with it). So beside it
we keep, per *workload signature* (model config, parallel layout, world size, accelerator,
software version), a reservoir of healthy per-step figures (the median rank's compute time; the
collective's transfer time) learned from past healthy windows, and compare new windows with
its median and MAD. A shifted window is then localized by topology: the groups (rack, leaf
switch, NVLink domain, node) whose ranks are slower than the baseline while the others are not.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .nanstats import nanmedian

__all__ = [
    "Baseline",
    "GroupShift",
    "localize",
    "outlier_groups",
    "shift_threshold",
    "steady_prefix",
    "workload_signature",
]

Arr = np.ndarray[Any, Any]

SIGNATURE_KEYS = (
    "model", "model_id", "model_version", "n_params", "n_layers", "d_model", "seq_len",
    "global_batch_size", "micro_batch_size", "tp", "pp", "dp", "cp", "ep", "accelerator",
    "dtype", "software_version", "framework_version", "cuda_version", "nccl_version",
)  # fmt: skip


def workload_signature(config: dict[str, Any], world_size: int) -> str:
    """A stable key for "the same workload": the config keys that set the step time."""
    picked = {k: config[k] for k in SIGNATURE_KEYS if k in config}
    picked["world_size"] = int(world_size)
    raw = json.dumps(picked, sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


@dataclass
class Baseline:
    """A bounded reservoir of healthy per-step values; robust centre and spread over it."""

    values: list[float] = field(default_factory=list)
    size: int = 512
    min_values: int = 10  # a block's steady part (see steady_prefix) may be all there is

    @property
    def ready(self) -> bool:
        return len(self.values) >= self.min_values

    @property
    def median(self) -> float:
        return float(np.median(self.values)) if self.values else float("nan")

    @property
    def mad(self) -> float:
        if not self.values:
            return float("nan")
        v = np.asarray(self.values)
        return float(np.median(np.abs(v - np.median(v))))

    def add(self, values: Arr) -> None:
        """Fold in a healthy window's values, keeping the most recent ``size``."""
        v = [float(x) for x in np.asarray(values).ravel() if np.isfinite(x) and x > 0]
        self.values = (self.values + v)[-self.size :]

    def to_json(self) -> dict[str, Any]:
        return {"values": [round(v, 6) for v in self.values], "size": self.size}

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> Baseline:
        d = d or {}
        return cls(list(map(float, d.get("values", []))), int(d.get("size", 512)))


def shift_threshold(b: Baseline, min_shift: float, z: float = 6.0) -> float:
    """The relative shift above which a window is slower than the baseline."""
    med = b.median
    return max(min_shift, z * 1.4826 * b.mad / med) if med > 0 else float("inf")


def steady_prefix(values: Arr, min_shift: float, edge: int = 10) -> int:
    """How many of a healthy-looking window's leading values a baseline may learn: all of them,
    unless the values step up for good inside it (a fault that began in the window; its median
    is not shifted while the fault holds less than half of it): then those before the step.

    The step is where the median of the values after it is the most above the median of those
    before (each side ``edge`` values or more), counted when it clears :func:`shift_threshold`
    of the values before it, the bar a whole window is judged by."""
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    ks = np.arange(edge, n - edge + 1)
    if not len(ks):
        return n
    before, after = _split_medians(v, ks)
    with np.errstate(all="ignore"):
        ratio = np.where(before > 0, after / before, np.nan)
    ratio[np.isnan(ratio)] = -np.inf
    j = int(np.argmax(ratio))  # the first of the highest
    if not ratio[j] > 1.0:
        return n
    best, cut = float(ratio[j]), int(ks[j])
    head = Baseline()
    head.add(v[:cut])
    return cut if len(head.values) >= edge and best - 1.0 >= shift_threshold(head, min_shift) else n


def _split_medians(v: Arr, ks: Arr) -> tuple[Arr, Arr]:
    """The NaN-skipping medians of ``v[:k]`` and of ``v[k:]`` for each ``k`` of ``ks``, a
    block of splits at a time (a block's rows times ``len(v)`` at most ~1M values)."""
    before, after = np.empty(len(ks)), np.empty(len(ks))
    j = np.arange(len(v))
    rows = max(1, (1 << 20) // max(len(v), 1))
    for lo in range(0, len(ks), rows):
        k = ks[lo : lo + rows, None]
        before[lo : lo + rows] = nanmedian(np.where(j < k, v, np.nan), axis=1)
        after[lo : lo + rows] = nanmedian(np.where(j >= k, v, np.nan), axis=1)
    return before, after


@dataclass(frozen=True)
class GroupShift:
    """A topology group slower than the baseline: ``ratio`` = group median / baseline."""

    level: str  # rack | switch | nvlink_domain | node | job
    group: str
    ratio: float
    ranks: tuple[int, ...]
    others_ratio: float


def localize(
    rank_values: Arr,
    baseline: Baseline,
    topology: dict[str, list[str]],
    min_shift: float = 0.03,
    min_ranks: int = 2,
) -> list[GroupShift]:
    """Groups whose median rank is slower than the baseline by more than the threshold.

    ``rank_values``: each rank's median compute over the window (NaN = no data);
    ``topology``: level -> one label per rank (levels tried coarse to fine). Returns the
    coarsest level that explains the shift: whole racks if the slow ranks fill racks, a job-wide
    group when every group of every level is slow, nothing when no group is. A group is slow
    when more than half its ranks are (its lower median is over the threshold)."""
    if not baseline.ready or rank_values.size == 0:
        return []
    ratio = rank_values / baseline.median
    thr = shift_threshold(baseline, min_shift)
    finite = np.isfinite(ratio)
    if finite.sum() >= min_ranks and float(np.median(ratio[finite])) - 1.0 >= thr:
        every = True
        for labels in topology.values():
            lab = np.asarray(labels, dtype=object)
            for g in set(lab[finite].tolist()):
                sel = finite & (lab == g)
                if float(np.median(ratio[sel])) - 1.0 < thr:
                    every = False
                    break
            if not every:
                break
        if every:
            r = tuple(np.flatnonzero(finite).tolist())
            return [GroupShift("job", "*", float(np.median(ratio[finite])), r, float("nan"))]
    for level, labels in topology.items():
        lab = np.asarray(labels, dtype=object)
        out = []
        for g in sorted(set(lab[finite].tolist())):
            if not g:
                continue
            sel = finite & (lab == g)
            if sel.sum() < min_ranks:
                continue
            gr = float(np.median(ratio[sel]))
            # Slow as a group when most of its ranks are: the lower median. Two slow ranks of
            # four (a straggler and a moving straggler's turn on one node) put the median
            # halfway up, and are two ranks' faults, not their NVLink domain's or node's.
            most = float(np.sort(ratio[sel])[(int(sel.sum()) - 1) // 2])
            if gr - 1.0 >= thr and most - 1.0 >= thr:
                rest = finite & ~sel
                other = float(np.median(ratio[rest])) if rest.any() else float("nan")
                if not np.isfinite(other) or other - 1.0 < thr:
                    out.append(GroupShift(level, g, gr, tuple(np.flatnonzero(sel).tolist()), other))
        if out:
            return out
    return []


def outlier_groups(
    rank_values: Arr, labels: list[str], min_shift: float, min_ranks: int = 2
) -> list[GroupShift]:
    """Groups (racks) whose median rank is slower than the median of the other ranks by
    ``min_shift`` or more: the peer check beside :func:`localize`, for when the baseline is not
    learned yet or a group holds most of the job (its slowness is then the job's median, and no
    rank of it is slower than the median). ``ratio`` is against the others, not the baseline."""
    lab = np.asarray(labels, dtype=object)
    finite = np.isfinite(rank_values)
    out = []
    for g in sorted(set(lab[finite].tolist())):
        sel = finite & (lab == g)
        rest = finite & ~sel
        if not g or sel.sum() < min_ranks or rest.sum() < min_ranks:
            continue
        ratio = float(np.median(rank_values[sel]) / np.median(rank_values[rest]))
        if ratio - 1.0 >= min_shift:
            out.append(GroupShift("rack", g, ratio, tuple(np.flatnonzero(sel).tolist()), 1.0))
    return out
