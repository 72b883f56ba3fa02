"""Scenario files, ``run_scenario`` and its result.

Scenarios are YAML files under ``fleetlens/sim/scenarios/`` (names starting with ``_`` are bases
for ``extends:``). ``run_scenario`` resolves faults, runs the timeline into a sink (server,
directory or nothing), writes ground truth next to the batches, and returns it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..errors import ConfigError
from .emit import Sink, open_sink
from .engine import Engine
from .faults import Injected, resolve_faults
from .model import Scenario, merge
from .rates import draw_faults
from .timeline import run_timeline
from .truth import GroundTruth, TruthFault

__all__ = [
    "SCENARIO_DIR",
    "SimResult",
    "list_scenarios",
    "load_scenario",
    "run_scenario",
    "simulate",
]

SCENARIO_DIR = Path(__file__).parent / "scenarios"


def list_scenarios() -> dict[str, str]:
    """Name -> description of every shipped scenario."""
    out = {}
    for p in sorted(SCENARIO_DIR.glob("*.yaml")):
        if not p.name.startswith("_"):
            out[p.stem] = str((yaml.safe_load(p.read_text()) or {}).get("description", ""))
    return out


def _raw(name_or_path: str | Path) -> dict[str, Any]:
    p = Path(name_or_path)
    if not p.suffix:
        p = SCENARIO_DIR / f"{name_or_path}.yaml"
    if not p.is_file():
        raise ConfigError(
            f"scenario {str(name_or_path)!r} not found; known: {list(list_scenarios())}"
        )
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"scenario file {p} must hold a mapping")
    base = data.get("extends")
    if base:
        parent = p.parent / f"{base}.yaml"
        data = merge(_raw(parent if parent.is_file() else base), data)
    data.setdefault("name", p.stem)
    return data


def load_scenario(name_or_path: str | Path) -> Scenario:
    return Scenario.from_dict(_raw(name_or_path))


@dataclass
class SimResult:
    truth: GroundTruth
    records: dict[str, int]
    elapsed_s: float
    truth_path: Path | None = None
    sink: Sink | None = field(default=None, repr=False)

    @property
    def records_per_s(self) -> float:
        return sum(self.records.values()) / self.elapsed_s if self.elapsed_s > 0 else 0.0


def _nominal(scn: Scenario) -> float:
    j = scn.job
    return j.steps * j.step_time * 1.04 + j.steps // j.checkpoint_every * j.checkpoint_write_s


def simulate(
    scn: Scenario,
    sink: Sink,
    *,
    seed: int | None = None,
    speed: float | None = None,
    start_time: float | None = None,
) -> GroundTruth:
    """Run ``scn`` into ``sink``; returns the ground truth."""
    seed = scn.seed if seed is None else seed
    speed = scn.speed if speed is None else speed
    if speed < 0:
        raise ConfigError(f"speed is {speed}; use 0 (as fast as possible) or a factor > 0")
    rng = np.random.default_rng(seed)
    specs = list(scn.faults) + (draw_faults(scn, scn.rates, rng) if scn.rates else [])
    faults = [f for f in resolve_faults(scn, specs, rng) if f.start < scn.job.steps]
    for f in faults:
        f.end = min(f.end, scn.job.steps) if f.info.mode in ("slow", "checkpoint") else f.end
    if start_time is None:
        start_time = scn.start_time or time.time() - _nominal(scn) * (
            1 - (1 / speed if speed >= 1 else 0)
        )
    eng = Engine(scn, faults, sink, seed=seed, speed=speed, start_time=start_time)
    run_timeline(eng)
    _pool_records(eng)
    eng.batcher.flush()
    return GroundTruth(
        scenario=scn.name,
        run_id=scn.job.run_id,
        seed=seed,
        world_size=scn.world_size,
        start_time=start_time,
        end_time=eng.t,
        steps=scn.job.steps,
        job_ids=eng.job_ids,
        faults=[_truth(eng, f) for f in faults if f.start_time is not None],
        losses=eng.loss,
        injected=eng.injected,
        records=dict(eng.batcher.total),
    )


def _truth(e: Engine, f: Injected) -> TruthFault:
    gpn = e.place.gpn
    return TruthFault(
        id=f.id,
        kind=f.kind,
        diagnosis=f.info.diagnosis,
        owner=f.info.owner,
        ranks=list(f.ranks),
        nodes=[e.place.name(n) for n in f.nodes],
        gpus=[f"{e.place.name(g // gpn)}:{g % gpn}" for g in f.gpus],
        rack=e.place.rack(f.nodes[0]) if f.rack >= 0 and f.nodes else "",
        start_step=f.start,
        end_step=f.end,
        start_time=f.start_time,
        end_time=f.end_time,
        job_ids=f.job_ids,
        fatal=f.trigger >= 0,
        magnitude=f.magnitude,
        params=f.params,
    )


def _pool_records(e: Engine) -> None:
    """Pool capacity over the run, and the other jobs sharing it (some with partial gangs)."""
    pool, c = e.scn.pool, e.scn.cluster
    cap = pool.capacity_gpus or (c.nodes + c.spare_nodes) * c.gpus_per_node
    oos = pool.out_of_service_nodes * c.gpus_per_node
    ts = np.arange(e.t0, e.t + 1e-9, pool.sample_s) if pool.sample_s > 0 else np.array([e.t0])
    down = np.zeros(len(ts))
    for a, b, g in e.down:
        down += np.where((ts >= a) & (ts < b), g, 0)
    n = len(ts)
    ctx = {"run_id": e.job.run_id, "job_id": e.job_ids[-1]}
    e.batcher.add(
        ctx,
        "sched_pool",
        n,
        {
            "pool": ([pool.name], np.zeros(n, np.uint32)),
            "time": ts,
            "capacity_gpus": np.full(n, cap, np.int32),
            "in_service_gpus": np.maximum(cap - oos - down, 0).astype(np.int32),
        },
    )
    rng = np.random.default_rng(e.seed + 11)
    span = max(e.t - e.t0, 1.0)
    k = pool.other_jobs
    if k <= 0:
        return
    submit = e.t0 + rng.uniform(0, span, k)
    start = submit + rng.exponential(120.0, k)
    gang = start + np.where(np.arange(k) < pool.partial_gangs, rng.uniform(300, 1800, k), 5.0)
    end = gang + rng.uniform(0.1, 0.5, k) * span
    e.batcher.add(
        ctx,
        "sched_alloc",
        k,
        {
            "pool": [pool.name] * k,
            "job_id": [f"other-{i:03d}" for i in range(k)],
            "run_id": [""] * k,
            "gpus": (8 * rng.integers(1, 9, k)).astype(np.int32),
            "submit": submit,
            "start": start,
            "gang_complete": gang,
            "end": np.where(end <= e.t, end, np.nan),
            "state": ["COMPLETED" if x <= e.t else "RUNNING" for x in end],
        },
    )


def run_scenario(
    name_or_path: str | Path | Scenario,
    server: str | None = None,
    out_dir: str | Path | None = None,
    speed: float | None = None,
    seed: int | None = None,
    sink: Sink | None = None,
    token: str | None = None,
    **overrides: Any,
) -> SimResult:
    """Run a scenario into ``server`` (HTTP, with ``token``, else ``$FLEETLENS_TOKEN``),
    ``out_dir`` (batch files) or ``sink``.

    Ground truth goes to ``out_dir/ground_truth.json`` when ``out_dir`` is given.
    ``overrides`` replace top-level scenario fields (e.g. ``job=replace(scn.job, steps=100)``).
    """
    scn = name_or_path if isinstance(name_or_path, Scenario) else load_scenario(name_or_path)
    if overrides:
        scn = replace(scn, **overrides)
    use = sink or open_sink(server, out_dir, token)
    t0 = time.perf_counter()
    try:
        truth = simulate(scn, use, seed=seed, speed=speed)
    finally:
        use.close()
    elapsed = time.perf_counter() - t0
    path = truth.write(Path(out_dir) / "ground_truth.json") if out_dir else None
    return SimResult(truth, truth.records, elapsed, path, use)
