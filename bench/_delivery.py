"""Play one simulated run into the server's ingest path and analysis loop in several ways and
compare what was found: live (ranks lagging each other, a pass after every delivery), in bursts
(random cuts of the rows in step order), out of order (the ranks' streams interleaved at random,
rows shuffled inside each batch) and all at once. Findings are a function of the data, so every
way must give the same ones (issue 18 item 1).

Shared by ``tests/test_verdict.py`` and ``bench/detection.py`` (``verdict_consistency``);
benchmarks never import ``tests/``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fleetlens.collector.ingest import Ingestor
from fleetlens.config import AnalyzerConfig
from fleetlens.services.analyzer import analyze_once
from fleetlens.sim import load_scenario
from fleetlens.sim.emit import MemorySink, encode
from fleetlens.sim.library import simulate
from fleetlens.sim.model import Scenario
from fleetlens.sim.truth import GroundTruth
from fleetlens.store.chdb_store import ChdbStore
from fleetlens.store.findings import FindingsStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.scope import Scope

__all__ = [
    "MODES", "Player", "Recorded", "Way", "findings_verdict", "from_matrix", "record",
    "record_scenario", "straggler_verdict",
]  # fmt: skip

MODES = ("live", "bursts", "shuffled", "bulk")

Batch = tuple[dict[str, str], dict[str, tuple[int, dict[str, Any]]]]


@dataclass
class Recorded:
    """A simulated run as batches: the step rows per job attempt, and everything else."""

    run_id: str
    other: list[Batch]
    steps: list[tuple[dict[str, str], dict[str, np.ndarray]]]  # (ctx, columns) per attempt
    first: list[Batch] = field(default_factory=list)  # sent before anything (the job's start)
    truth: GroundTruth | None = None  # what the simulator injected, for a simulated run


@dataclass(frozen=True)
class Way:
    """How to deliver: ``mode`` and its knobs (drawn by the caller)."""

    mode: str
    seed: int = 0
    max_lag: int = 30  # live: how many steps a rank's rows may trail the fastest rank's
    tick: int = 10  # live: steps between two deliveries (and passes)
    chunks: int = 12  # bursts / shuffled: how many deliveries


def record(name: str, steps: int, seed: int, start_time: float = 1.7e9) -> Recorded:
    """Simulate scenario ``name`` cut to ``steps`` steps (its faults too) into memory."""
    scn = load_scenario(name)
    return record_scenario(replace(scn, job=replace(scn.job, steps=steps)), seed, start_time)


def record_scenario(scn: Scenario, seed: int, start_time: float = 1.7e9) -> Recorded:
    """Simulate ``scn`` into memory."""
    sink = MemorySink()
    truth = simulate(scn, sink, seed=seed, speed=0, start_time=start_time)
    other: list[Batch] = []
    per_job: dict[str, tuple[dict[str, str], list[dict[str, np.ndarray]]]] = {}
    for ctx, tables in sink.batches:
        rest = {k: v for k, v in tables.items() if k != "step"}
        if rest:
            other.append((ctx, rest))
        if "step" in tables:
            per_job.setdefault(ctx["job_id"], (ctx, []))[1].append(tables["step"][1])
    merged = [
        (ctx, {c: np.concatenate([p[c] for p in parts]) for c in parts[0]})
        for ctx, parts in per_job.values()
    ]
    return Recorded(scn.job.run_id, other, merged, truth=truth)


def from_matrix(
    run_id: str,
    steps: np.ndarray,
    compute: np.ndarray,
    t0: float,
    config: dict[str, Any] | None = None,
) -> Recorded:
    """A synchronous job from a (steps x ranks) matrix of compute seconds (NaN: no row): each
    step lasts as long as its slowest rank, the others wait in the collective. ``config``: the
    run's config, announced first in a ``job_start`` event as the SDK does."""
    world = compute.shape[1]
    ctx = {"run_id": run_id, "job_id": f"{run_id}-a0", "project": "real"}
    dur = np.nanmax(np.where(np.isfinite(compute), compute, np.nan), axis=1)
    start = t0 + np.concatenate([[0.0], np.cumsum(dur)[:-1]])
    i, r = np.nonzero(np.isfinite(compute))
    c = compute[i, r]
    cols = {
        "step": steps[i].astype(np.int64), "rank": r.astype(np.int32), "time": start[i],
        "duration": dur[i], "forward": 0.3 * c, "backward": 0.6 * c, "optimizer": 0.1 * c,
        "comm": dur[i] - c, "data_wait": np.zeros(len(i)),
    }  # fmt: skip
    place = {
        "time": np.full(world, t0), "rank": np.arange(world, dtype=np.int32),
        "local_rank": np.zeros(world, dtype=np.int32), "world_size": np.full(world, world),
        "node_id": [f"node{k}" for k in range(world)], "gpu": np.zeros(world, dtype=np.int32),
        "gpu_uuid": [f"GPU-{k}" for k in range(world)], "rack": ["r0"] * world,
        "switch": ["s0"] * world, "nvlink_domain": [f"node{k}" for k in range(world)],
    }  # fmt: skip
    first: list[Batch] = []
    if config is not None:
        start_event = {
            "time": np.array([t0]), "kind": ["job_start"], "step": np.array([-1]),
            "rank": np.array([0]), "node_id": ["node0"], "gpu": np.array([0]), "message": [""],
            "attrs": [json.dumps({"config": config, "world_size": world})],
        }  # fmt: skip
        first.append((ctx, {"event": (1, start_event)}))
    return Recorded(run_id, [(ctx, {"placement": (world, place)})], [(ctx, cols)], first)


def _take(cols: dict[str, np.ndarray], idx: np.ndarray) -> tuple[int, dict[str, Any]]:
    return len(idx), {c: v[idx] for c, v in cols.items()}


def _ticks(rec: Recorded, way: Way) -> list[list[Batch]]:
    """The deliveries of ``way``: a list of ticks, each a list of batches (a pass after each)."""
    rng = np.random.default_rng(way.seed)
    # placement (it declares the world size) first, the rest of the run's records last
    first = [(c, {k: v for k, v in t.items() if k == "placement"}) for c, t in rec.other]
    last = [(c, {k: v for k, v in t.items() if k != "placement"}) for c, t in rec.other]
    ticks: list[list[Batch]] = [rec.first + [b for b in first if b[1]]]
    if way.mode == "bulk":
        for ctx, cols in rec.steps:
            ticks[0].append((ctx, {"step": _take(cols, np.arange(len(cols["step"])))}))
        return [ticks[0] + [b for b in last if b[1]]]
    for ctx, cols in rec.steps:
        step, rank = cols["step"], cols["rank"]
        order = np.lexsort((rank, step))
        if way.mode == "live":
            lag = rng.integers(0, way.max_lag + 1, int(rank.max()) + 1)
            due = step + lag[rank]  # the step of the fastest rank when this row arrives
            for t in range(int(step.min()) + way.tick, int(due.max()) + 2 * way.tick, way.tick):
                idx = np.flatnonzero((due >= t - way.tick) & (due < t))
                if len(idx):
                    ticks.append([(ctx, {"step": _take(cols, idx[np.lexsort((step[idx],))])})])
        elif way.mode == "bursts":
            cuts = np.sort(rng.choice(np.arange(1, len(order)), way.chunks - 1, replace=False))
            ticks += [[(ctx, {"step": _take(cols, part)})] for part in np.split(order, cuts)]
        elif way.mode == "shuffled":
            # every rank's own rows stay in step order (one sender per process); the ranks'
            # streams interleave at random and each batch's rows are shuffled
            pos = np.empty(len(step))
            for r in np.unique(rank):
                mine = np.flatnonzero(rank == r)
                pos[mine[np.argsort(step[mine])]] = np.sort(rng.random(len(mine)))
            seq = np.argsort(pos)
            cuts = np.sort(rng.choice(np.arange(1, len(seq)), way.chunks - 1, replace=False))
            for part in np.split(seq, cuts):
                ticks.append([(ctx, {"step": _take(cols, rng.permutation(part))})])
        else:
            raise ValueError(f"mode {way.mode!r} is not one of {MODES}")
    return [*ticks, [b for b in last if b[1]]]


class Player:
    """One chDB + SQLite pair; every delivery plays into its own tenant."""

    def __init__(self, root: Path) -> None:
        self.tel = ChdbStore(str(root / "telemetry"))
        self.meta = MetadataStore(f"sqlite:///{root}/meta.db")
        self.ing = Ingestor(self.tel, self.meta)
        self.store = FindingsStore(self.meta)
        self.cfg = AnalyzerConfig(max_steps=100)
        self._n = 0

    def play(self, rec: Recorded, way: Way) -> list[dict[str, Any]]:
        """Deliver ``rec`` the way ``way`` says, a pass after each delivery, then passes until
        the loop has nothing left; the run's findings."""
        self._n += 1
        tenant = f"t{self._n}-{way.mode}"
        for tick in _ticks(rec, way):
            for ctx, tables in tick:
                self.ing.ingest(encode(ctx, tables), "application/msgpack", "", tenant)
            self.ing.registry.flush()
            analyze_once(self.tel, self.store, time.time(), self.cfg)
        for _ in range(200):
            if not self.store.runs_with_new_data():
                break
            analyze_once(self.tel, self.store, time.time(), self.cfg)
        rows = self.store.rows(Scope(tenant, "viewer"), rec.run_id)
        return [r.__dict__ for r in rows]

    def close(self) -> None:
        self.meta.close()
        self.tel.close()


def straggler_verdict(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What a user reads of the straggler findings: kind of straggler, ranks, span, detection."""
    return sorted(
        (r["diagnosis"], tuple(r["ranks"]), r["start_step"], r["end_step"], r["step"])
        for r in rows
        if r["kind"] == "straggler"
    )


def findings_verdict(
    rows: list[dict[str, Any]], skip: tuple[str, ...] = ()
) -> list[tuple[Any, ...]]:
    """Every finding but the kinds in ``skip``: kind, diagnosis, ranks, span."""
    return sorted(
        (r["kind"], r["diagnosis"], tuple(r["ranks"]), r["start_step"], r["end_step"])
        for r in rows
        if r["kind"] not in skip
    )
