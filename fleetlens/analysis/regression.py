"""Regression tiers (seed 003 s9.3.4, table 4): a run against the fleet's baseline.

A *workload* is what sets the step time apart from the software: the config's model keys and
the world size (:data:`fleetlens.analysis.baseline.SIGNATURE_KEYS` less the software versions).
Its *architecture* is the same less the keys that grow with the allocation (the world size,
``dp``, ``global_batch_size``): the runs of one architecture at every scale. Runs are grouped by
their software (the image, torch, CUDA, NCCL, driver their ranks reported, and the config's own
version keys). A run is judged against the runs that started before it, on the software of the
newest of them: its own software when it did not change, else the software it replaced, and
then the versions that differ are what it names ("image train:1 vs train:2"). The tiers:

- **program**: the run's median step time against its workload's runs' (lower is better);
- **mfu**: its MFU of retained steps (the program goodput of its goodput breakdown: replayed
  steps do not count) against its architecture's runs' at a like scale (a world within 1.5x of
  its own: MFU falls as a job grows, which the scaling tier judges; higher is better; a config
  that names FLOPs and an accelerator or peak has one);
- **token**: for a run without an MFU that logs tokens, its GPU-seconds a token (its ranks over
  its tokens a second: the step time a token, per GPU) against its architecture's runs' at a
  like scale;
- **scaling** (small-scale canaries): its throughput per GPU over the throughput per GPU of the
  smallest runs of its architecture on its software (one node, say), the scaling efficiency at
  its world size, against the same ratio of the newest earlier software that ran both sizes: a
  change that bends the curve before full-fleet launch;
- **startup**: from a fresh start's ``job_start`` to its first step (graph compilation, loading,
  the rendezvous); a run restarted since has none, and a start must be 5 s over besides;
- **recovery**: the median time from an attempt's last step to the next attempt's first (the
  failure's detection, requeue, restart, checkpoint load), 10 s over besides;
- **checkpoint**: the median pause of a checkpoint commit (its ``checkpoint_end`` duration), 1 s
  over besides;
- **allocation**: submission to gang completion of the run's first allocation, against the
  newest earlier allocations of its pool of a like size (:func:`allocation`).

A run is worse when its figure is past the baseline's median by more than ``tolerance`` and
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
    "Tier",
    "Verdict",
    "allocation",
    "architecture_key",
    "judge",
    "workload_key",
]

CONFIG_SOFTWARE_KEYS = ("software_version", "framework_version", "cuda_version", "nccl_version")
"""Software versions a config may name: they are the software's, not the workload's."""
MODEL_KEYS = ("model", "model_id", "n_params", "n_layers", "d_model")
"""A workload names its model by one of these at least (a dtype alone names no workload)."""
SCALE_KEYS = ("dp", "global_batch_size")
"""Config keys that grow with the allocation: an architecture's runs at every scale differ."""


@dataclass(frozen=True)
class Tier:
    """What a tier compares: a figure of :class:`RunFigures`, the least excess over the
    baseline's median that counts (a start 0.3 s slower than 0.25 s is no regression), which
    way is better, and whose runs are its baseline (``workload`` or ``architecture``)."""

    attr: str
    what: str
    unit: str = "s"
    least: float = 0.0
    higher_is_better: bool = False
    over: str = "workload"


TIERS = {
    "program": Tier("step_s", "median step time"),
    "mfu": Tier("mfu", "MFU of retained steps", "", 0.0, True, "architecture"),
    "token": Tier("gpu_s_per_token", "GPU-seconds a token", "s", over="architecture"),
    "scaling": Tier("scaling", "scaling efficiency against its smallest runs", "", 0.0, True),
    "startup": Tier("startup_s", "startup (job start to first step)", least=5.0),
    "recovery": Tier("recovery_s", "recovery (an attempt's last step to the next's)", least=10.0),
    "checkpoint": Tier("checkpoint_s", "checkpoint pause per commit", least=1.0),
    "allocation": Tier("alloc_s", "allocation (submission to gang complete)", least=60.0),
}
LIKE_SCALE = 1.5
"""The architecture's tiers compare runs whose worlds are within this factor of each other."""


def _picked(config: Mapping[str, Any], drop: Sequence[str]) -> dict[str, Any] | None:
    if not any(k in config for k in MODEL_KEYS):
        return None
    return {
        k: config[k]
        for k in SIGNATURE_KEYS
        if k in config and k not in CONFIG_SOFTWARE_KEYS and k not in drop
    }


def _hash(picked: Mapping[str, Any]) -> str:
    raw = json.dumps(picked, sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def workload_key(config: Mapping[str, Any], world_size: int) -> str | None:
    """The workload a run's config names (its model keys, its world size), None when it names
    no model (the world size alone would make every job of one size the same workload)."""
    picked = _picked(config, ())
    if picked is None:
        return None
    return _hash({**picked, "world_size": int(world_size)})


def architecture_key(config: Mapping[str, Any]) -> str | None:
    """The architecture a run's config names: its workload at any scale (None: no model)."""
    picked = _picked(config, SCALE_KEYS)
    return None if picked is None else _hash(picked)


@dataclass(frozen=True)
class RunFigures:
    """What a run is judged on: when it first stepped, its software, its figures (seconds
    unless said)."""

    run_id: str
    t_first: float
    software: dict[str, str]
    step_s: float | None
    startup_s: float | None  # a fresh start's only: a resumed attempt also loads its state
    steps: int = 0
    from_step: int = 0  # the newest attempt's first step
    to_step: int = 0  # and its last
    world_size: int = 0
    mfu: float | None = None  # a share of the devices' peak
    gpu_rate: float | None = None  # tokens (else steps) a second per rank
    gpu_s_per_token: float | None = None  # ranks over tokens a second; None: no tokens
    recovery_s: float | None = None  # None: never restarted
    checkpoint_s: float | None = None
    alloc_s: float | None = None  # its first allocation's, with the pool, submission, GPUs
    pool: str | None = None
    alloc_submit: float | None = None
    alloc_gpus: int = 0
    workload: str | None = None
    architecture: str | None = None


@dataclass(frozen=True)
class Verdict:
    """A run's figure of one tier against its baseline."""

    tier: str
    value: float
    baseline: float  # the baseline runs' median
    bound: float  # past it, the run is worse
    runs: list[str]  # the baseline's runs (allocations: scheduler jobs), oldest first
    software: dict[str, str]  # the baseline's
    changes: list[str] = field(default_factory=list)  # "image train:1 vs train:2"

    @property
    def worse(self) -> bool:
        if TIERS[self.tier].higher_is_better:
            return self.value < self.bound
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


def _verdict(
    tier: str,
    value: float,
    got: Sequence[tuple[str, float]],
    software: Mapping[str, str],
    changes: list[str],
    tolerance: float,
) -> Verdict:
    t = TIERS[tier]
    values = np.array([v for _, v in got], dtype=np.float64)
    median = float(np.median(values))
    spread = 3.0 * 1.4826 * float(np.median(np.abs(values - median)))
    if t.higher_is_better:
        bound = min(median * (1.0 - tolerance) - spread, median - t.least)
    else:
        bound = max(median * (1.0 + tolerance) + spread, median + t.least)
    runs = [r for r, _ in got]
    return Verdict(tier, float(value), median, bound, runs, dict(software), changes)


def _alike(run: RunFigures, other: RunFigures, over: str) -> bool:
    """Whether ``other`` is of the run's workload, or of its architecture at a like scale."""
    if over == "workload":
        return other.workload == run.workload
    lo, hi = sorted((run.world_size, other.world_size))
    return other.architecture == run.architecture and lo > 0 and hi <= LIKE_SCALE * lo


def _reference(run: RunFigures, others: Sequence[RunFigures]) -> list[RunFigures]:
    """The runs of ``others`` that started before ``run`` on the software of the newest."""
    earlier = sorted(
        (o for o in others if o.t_first < run.t_first and o.run_id != run.run_id),
        key=lambda o: o.t_first,
    )
    return [o for o in earlier if o.software == earlier[-1].software] if earlier else []


def judge(
    run: RunFigures,
    others: Sequence[RunFigures],
    tolerance: float = 0.1,
    min_runs: int = 2,
) -> list[Verdict]:
    """``run`` against the runs that started before it (``others`` may hold any: those of its
    architecture at other scales serve the architecture's tiers; a run is not its own
    baseline): one verdict per tier that has a baseline (the allocation tier excepted)."""
    out = []
    for tier, t in TIERS.items():
        if tier in ("scaling", "allocation"):
            continue
        base = _reference(run, [o for o in others if _alike(run, o, t.over)])
        value = getattr(run, t.attr)
        got = [(o.run_id, getattr(o, t.attr)) for o in base if getattr(o, t.attr) is not None]
        if value is None or len(got) < min_runs:
            continue
        sw = base[-1].software
        out.append(_verdict(tier, value, got, sw, _changes(sw, run.software), tolerance))
    scaled = _scaling(run, others, tolerance, min_runs)
    return out + ([scaled] if scaled is not None else [])


def _scaling(
    run: RunFigures, others: Sequence[RunFigures], tolerance: float, min_runs: int
) -> Verdict | None:
    """The canary tier: the run's scaling efficiency on its software against the newest
    earlier software's at the same two sizes (each size's median rate per GPU)."""
    if run.gpu_rate is None or run.world_size <= 0:
        return None
    rated = [
        o
        for o in others
        if o.gpu_rate is not None
        and o.run_id != run.run_id
        and o.world_size > 0
        and o.architecture == run.architecture
    ]
    small = [
        o
        for o in rated
        if o.software == run.software and o.world_size < run.world_size and o.t_first <= run.t_first
    ]
    if not small:
        return None
    n0 = min(o.world_size for o in small)
    mine = float(np.median([o.gpu_rate for o in small if o.world_size == n0]))
    if mine <= 0:
        return None
    earlier = sorted(
        (o for o in rated if o.t_first < run.t_first and o.software != run.software),
        key=lambda o: -o.t_first,
    )
    for sw in dict.fromkeys(json.dumps(o.software, sort_keys=True) for o in earlier):
        of_sw = [o for o in earlier if json.dumps(o.software, sort_keys=True) == sw]
        at0 = [o.gpu_rate for o in of_sw if o.world_size == n0 and o.gpu_rate]
        at_n = [(o.run_id, o.gpu_rate) for o in of_sw if o.world_size == run.world_size]
        if at0 and len(at_n) >= min_runs:
            ref = float(np.median(at0))
            got = [(r, float(v or 0.0) / ref) for r, v in reversed(at_n)]
            software = of_sw[0].software
            changes = _changes(software, run.software)
            return _verdict("scaling", run.gpu_rate / mine, got, software, changes, tolerance)
    return None


def allocation(
    run: RunFigures,
    pool_waits: Sequence[tuple[str, float]],
    tolerance: float = 0.1,
    min_runs: int = 2,
) -> Verdict | None:
    """The run's first allocation's wait against ``pool_waits``: the (job, wait) of its pool's
    allocations of a like size submitted before it, oldest first. The pool's policy is what
    it judges, so it names no software change."""
    if run.alloc_s is None or len(pool_waits) < min_runs:
        return None
    return _verdict("allocation", run.alloc_s, pool_waits, {}, [], tolerance)
