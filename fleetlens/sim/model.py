"""What a scenario describes: cluster, job, scheduler pool, noise, emission and faults.

Typed dataclasses built from a plain mapping (a YAML file), validated with messages that name
the bad key and the fix. A scenario may ``extends: <other scenario>``; the mappings are merged
(the child wins, nested mappings merge, lists replace), so each fault file stays a few lines.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .calibration import CALIBRATION

__all__ = [
    "Cluster",
    "Emission",
    "FaultSpec",
    "Job",
    "Noise",
    "Pool",
    "Rates",
    "Scenario",
    "merge",
]


@dataclass(frozen=True)
class Cluster:
    """Topology: nodes of ``gpus_per_node`` GPUs, racks of nodes, leaf switches, NVLink domains."""

    nodes: int = 8
    gpus_per_node: int = 8
    nodes_per_rack: int = 4
    nodes_per_switch: int = 2
    nodes_per_nvlink_domain: int = 1
    spare_nodes: int = 4
    node_prefix: str = "node"
    fleet: str = ""
    """Prefixes every node, rack, switch, NVLink domain and GPU name ("" none): scenarios
    played into one server are separate fleets unless given the same ``fleet``."""


@dataclass(frozen=True)
class Job:
    """The training job; times in seconds. ``steps`` is the run's target step count."""

    run_id: str = "sim-run"
    project: str = "sim"
    tenant: str = ""
    world_size: int = 0  # 0: every GPU of cluster.nodes
    tp: int = 8
    pp: int = 1
    stage_work: tuple[float, ...] = ()
    """Each pipeline stage's compute relative to a balanced split (``pp`` values; empty: equal):
    ``(1, 1, 1, 1.4)`` is a last stage doing 40% more work (the loss and output embedding). The
    job announces ``tp`` and ``pp`` in its config when ``pp`` > 1."""
    batch_cov: float = 0.0
    """How much a data-parallel replica's batch costs varies from step to step (sequence lengths,
    packing): every rank of the replica, at every stage, computes ``1 + batch_cov * N(0, 1)``
    times as long that step, drawn anew each step. Slowness that moves between replicas: the
    data's, not a worker's."""
    model_params: float = 8e9
    tokens_per_step: int = 4_194_304
    step_time: float = 1.0
    comm_fraction: float = 0.08
    data_wait_fraction: float = 0.004
    steps: int = 1000
    checkpoint_every: int = 200
    checkpoint_write_s: float = 20.0
    checkpoint_async: bool = False
    async_stall_fraction: float = 0.1
    startup_s: float = 120.0
    gang_s: float = 15.0
    detect_s: float = 60.0
    restart_s: float = 60.0
    hang_timeout_s: float = 600.0
    preempt_wait_s: float = 900.0
    maintenance_s: float = 1800.0


@dataclass(frozen=True)
class Noise:
    """Healthy noise; defaults are the calibrated figures (see calibration.py)."""

    rank_cov: float = CALIBRATION.rank_cov
    step_cov: float = CALIBRATION.step_cov
    rank_offset_cov: float = 0.0


@dataclass(frozen=True)
class Pool:
    name: str = "pool-a"
    capacity_gpus: int = 0  # 0: (nodes + spares) * gpus_per_node
    other_jobs: int = 6
    partial_gangs: int = 1
    out_of_service_nodes: int = 0
    sample_s: float = 300.0


@dataclass(frozen=True)
class Emission:
    """Volume knobs: collectives on every ``collective_every``-th step for up to
    ``collective_ranks`` ranks (0 = all), device samples every ``sample_s`` seconds."""

    collective_every: int = 10
    collective_ranks: int = 0
    sample_s: float = 10.0
    batch_rows: int = 200_000


@dataclass(frozen=True)
class FaultSpec:
    """One injected fault. ``step`` (global step) or ``at`` (seconds after run start)."""

    kind: str
    step: int = -1
    at: float = -1.0
    duration_steps: int = 0
    ranks: tuple[int, ...] = ()
    node: int = -1
    gpu: int = -1
    rack: int = -1
    magnitude: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rates:
    """Failure arrivals drawn from a published mix. ``scale``: ``fleet`` replays the source's
    count over the same span; ``per_gpu`` scales it by GPUs x time; ``multiplier`` on top."""

    model: str = "llama3_405b"
    scale: str = "per_gpu"
    multiplier: float = 1.0


@dataclass(frozen=True)
class Scenario:
    name: str = "scenario"
    description: str = ""
    seed: int = 0
    speed: float = 0.0
    start_time: float = 0.0  # 0: chosen so the run ends about now at the given speed
    cluster: Cluster = Cluster()
    job: Job = Job()
    noise: Noise = Noise()
    pool: Pool = Pool()
    emission: Emission = Emission()
    faults: tuple[FaultSpec, ...] = ()
    rates: Rates | None = None

    @property
    def world_size(self) -> int:
        return self.job.world_size or self.cluster.nodes * self.cluster.gpus_per_node

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Scenario:
        data = dict(data)
        data.pop("extends", None)
        kw: dict[str, Any] = {}
        subs = {"cluster": Cluster, "job": Job, "noise": Noise, "pool": Pool, "emission": Emission}
        for key, value in data.items():
            if key in subs:
                kw[key] = _build(subs[key], value or {}, key)
            elif key == "faults":
                kw[key] = tuple(_fault(f, i) for i, f in enumerate(value or []))
            elif key == "rates":
                kw[key] = _build(Rates, value, key) if value else None
            elif key in ("name", "description", "seed", "speed", "start_time"):
                kw[key] = value
            else:
                raise ConfigError(f"scenario key {key!r} is not known; known: {_names(Scenario)}")
        scn = Scenario(**kw)
        _check(scn)
        return scn


def _names(cls: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _build(cls: Any, value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise ConfigError(f"scenario section {where!r} must be a mapping, not {value!r}")
    unknown = set(value) - set(_names(cls))
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; known: {_names(cls)}")
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in value:
            v, default = value[f.name], getattr(cls(), f.name)
            try:
                # YAML 1.1 reads 7.0e9 (no sign in the exponent) as a string; cast by the default
                if isinstance(default, tuple):
                    out[f.name] = tuple(float(x) for x in v)
                else:
                    out[f.name] = type(default)(v) if isinstance(default, int | float) else v
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{where}.{f.name} is {v!r}; expected a number") from exc
    return cls(**out)


def _fault(value: Any, i: int) -> FaultSpec:
    from .faults import FAULT_KINDS

    if not isinstance(value, dict) or "kind" not in value:
        raise ConfigError(f"faults[{i}] must be a mapping with a 'kind'")
    known = set(_names(FaultSpec))
    params = {k: v for k, v in value.items() if k not in known}
    spec = {k: v for k, v in value.items() if k in known}
    if spec["kind"] not in FAULT_KINDS:
        raise ConfigError(f"faults[{i}].kind {spec['kind']!r} is not known: {sorted(FAULT_KINDS)}")
    if "ranks" in spec:
        spec["ranks"] = tuple(int(r) for r in spec["ranks"])
    spec["params"] = {**spec.get("params", {}), **params}
    if spec.get("step", -1) < 0 and spec.get("at", -1.0) < 0:
        raise ConfigError(f"faults[{i}] ({spec['kind']}) needs 'step' or 'at'")
    return FaultSpec(**spec)


def _check(s: Scenario) -> None:
    world = s.world_size
    gpus = s.cluster.nodes * s.cluster.gpus_per_node
    if world <= 0 or world > gpus:
        raise ConfigError(f"job.world_size {world} must be 1..{gpus} (cluster GPUs)")
    if s.job.steps <= 0 or s.job.step_time <= 0:
        raise ConfigError("job.steps and job.step_time must be > 0")
    if s.job.checkpoint_every <= 0:
        raise ConfigError(f"job.checkpoint_every is {s.job.checkpoint_every}; must be >= 1")
    if s.speed < 0:
        raise ConfigError(f"speed is {s.speed}; use 0 (as fast as possible) or a factor > 0")
    if not 0.0 <= s.job.batch_cov < 0.5:
        raise ConfigError(f"job.batch_cov is {s.job.batch_cov}; use 0 (none) up to 0.5")
    work = s.job.stage_work
    if work and (len(work) != s.job.pp or min(work) <= 0 or world % s.job.pp):
        raise ConfigError(
            f"job.stage_work {list(work)} needs one positive value per pipeline stage "
            f"(pp {s.job.pp}) and a world ({world}) that pp divides"
        )
    for f in s.faults:
        bad = [r for r in f.ranks if not 0 <= r < world]
        if bad:
            raise ConfigError(f"fault {f.kind}: ranks {bad} are outside 0..{world - 1}")


def merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge two scenario mappings; the child wins, nested mappings merge."""
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out
