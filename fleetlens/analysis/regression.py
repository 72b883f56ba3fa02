"""Regression tiers (seed 003 s9.3.4): a run against the fleet's baseline of its workload.

A *workload* is what sets the step time apart from the software: the config's model keys and
the world size (:data:`fleetlens.analysis.baseline.SIGNATURE_KEYS` less the software versions).
Its runs are grouped by their software (the image, torch, CUDA, NCCL, driver their ranks
reported, and the config's own version keys). A run is judged against the runs of its workload
that started before it, on the software of the newest of them: its own software when it did
not change, else the software it replaced, and then the versions that differ are what it names
("image train:1 vs train:2"). Two tiers:

- **program**: the run's median step time against the baseline runs' median step times;
- **startup**: from a fresh start's ``job_start`` to its first step (graph compilation, loading,
  the rendezvous), against theirs; a run restarted since (its newest attempt resumes) has none,
  and a start must be 5 s over the baseline's median besides to count.

A run is worse when its figure is over the baseline's median by more than ``tolerance`` and
three median absolute deviations of the baseline; a baseline needs ``min_runs`` runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .baseline import SIGNATURE_KEYS
from .contract import SOFTWARE_NAMES

__all__ = [
    "CONFIG_SOFTWARE_KEYS",
    "MODEL_KEYS",
    "TIERS",
    "RunFigures",
    "Verdict",
    "judge",
    "workload_key",
]

CONFIG_SOFTWARE_KEYS = ("software_version", "framework_version", "cuda_version", "nccl_version")
"""Software versions a config may name: they are the software's, not the workload's."""
MODEL_KEYS = ("model", "model_id", "n_params", "n_layers", "d_model")
"""A workload names its model by one of these at least (a dtype alone names no workload)."""
TIERS = {"program": ("step_s", 0.0), "startup": ("startup_s", 5.0)}
"""Each tier: the figure of a run it compares (seconds; lower is better) and the least excess
over the baseline's median that counts (a start 0.3 s slower than 0.25 s is no regression)."""


def workload_key(config: Mapping[str, Any], world_size: int) -> str | None:
    """The workload a run's config names (its model keys, its world size), None when it names
    no model (the world size alone would make every job of one size the same workload)."""
    if not any(k in config for k in MODEL_KEYS):
        return None
    picked = {k: config[k] for k in SIGNATURE_KEYS if k in config and k not in CONFIG_SOFTWARE_KEYS}
    picked["world_size"] = int(world_size)
    raw = json.dumps(picked, sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunFigures:
    """What a run is judged on: when it first stepped, its software, its figures (seconds)."""

    run_id: str
    t_first: float
    software: dict[str, str]
    step_s: float | None
    startup_s: float | None  # a fresh start's only: a resumed attempt also loads its state
    steps: int = 0
    from_step: int = 0  # the newest attempt's first step
    to_step: int = 0  # and its last


@dataclass(frozen=True)
class Verdict:
    """A run's figure of one tier against its baseline."""

    tier: str
    value: float
    baseline: float  # the baseline runs' median
    bound: float  # over it, the run is worse
    runs: list[str]  # the baseline's runs, oldest first
    software: dict[str, str]  # the baseline's
    changes: list[str] = field(default_factory=list)  # "image train:1 vs train:2"

    @property
    def worse(self) -> bool:
        return self.value > self.bound

    @property
    def ratio(self) -> float | None:
        return self.value / self.baseline if self.baseline > 0 else None


def _changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """The versions both name and differ in, said as the contract says them."""
    return [
        f"{SOFTWARE_NAMES.get(k, k)} {before[k]} vs {after[k]}"
        for k in before
        if k in after and before[k] != after[k]
    ]


def judge(
    run: RunFigures,
    others: Sequence[RunFigures],
    tolerance: float = 0.1,
    min_runs: int = 2,
) -> list[Verdict]:
    """``run`` against the runs of its workload that started before it (``others`` may hold
    any; a run is not its own baseline): one verdict per tier that has a baseline."""
    before = [o for o in others if o.t_first < run.t_first and o.run_id != run.run_id]
    earlier = sorted(before, key=lambda o: o.t_first)
    if not earlier:
        return []
    reference = earlier[-1].software  # the software the run followed
    base = [o for o in earlier if o.software == reference]
    out = []
    for tier, (attr, least) in TIERS.items():
        value = getattr(run, attr)
        got = [(o.run_id, getattr(o, attr)) for o in base if getattr(o, attr) is not None]
        if value is None or len(got) < min_runs:
            continue
        values = np.array([v for _, v in got], dtype=np.float64)
        median = float(np.median(values))
        mad = float(np.median(np.abs(values - median)))
        bound = max(median * (1.0 + tolerance) + 3.0 * 1.4826 * mad, median + least)
        changes = _changes(reference, run.software)
        runs = [r for r, _ in got]
        out.append(Verdict(tier, float(value), median, bound, runs, dict(reference), changes))
    return out
