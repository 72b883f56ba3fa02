"""Play generated fleets (``fleetlens.sim.generate``) through the real ingest path into chDB
and run the server's analysis loop in-process, as ``bench/_detect_harness.py`` does: every run
of a fleet goes into the fleet's tenant (node names reused), then the loop runs pass after pass
(100 steps a pass) until it has nothing left, and each run's findings are read back.

Used by ``bench/detection.py`` (benchmarks never import ``tests/``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fleetlens.collector.ingest import Ingestor
from fleetlens.config import AnalyzerConfig
from fleetlens.services.analyzer import analyze_once
from fleetlens.sim.emit import encode
from fleetlens.sim.generate import Fleet
from fleetlens.sim.library import simulate
from fleetlens.sim.truth import GroundTruth
from fleetlens.store.chdb_store import ChdbStore
from fleetlens.store.findings import FindingsStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.scope import Scope

__all__ = ["FleetPlayer", "PlayedRun"]


@dataclass
class PlayedRun:
    truth: GroundTruth
    findings: list[dict[str, Any]]
    step_start: dict[int, float]  # global step -> data time it first started

    @property
    def rank_hours(self) -> float:
        return self.truth.world_size * self.truth.wall_clock / 3600.0

    def seconds(self, a: int, b: int) -> float:
        """Data time from step ``a`` to step ``b`` (nearest recorded steps)."""
        ks = np.array(sorted(self.step_start))
        ts = np.array([self.step_start[int(k)] for k in ks])
        ia = min(int(np.searchsorted(ks, a)), len(ks) - 1)
        ib = min(int(np.searchsorted(ks, b)), len(ks) - 1)
        return max(0.0, float(ts[ib] - ts[ia]))


class _Sink:
    def __init__(self, ing: Ingestor, tenant: str) -> None:
        self.ing, self.tenant = ing, tenant
        self.step_start: dict[int, float] = {}

    def send(self, ctx: dict[str, str], tables: dict[str, Any]) -> None:
        if "step" in tables:
            cols = tables["step"][1]
            steps, first = np.unique(cols["step"], return_index=True)
            for s, t in zip(steps.tolist(), cols["time"][first].tolist(), strict=True):
                self.step_start.setdefault(int(s), float(t))
        self.ing.ingest(encode(ctx, tables), "application/msgpack", "", self.tenant)

    def close(self) -> None:
        pass


class FleetPlayer:
    def __init__(self, root: Path) -> None:
        self.tel = ChdbStore(str(root / "telemetry"))
        self.meta = MetadataStore(f"sqlite:///{root}/meta.db")
        self.ing = Ingestor(self.tel, self.meta)
        self.store = FindingsStore(self.meta)
        self.cfg = AnalyzerConfig(max_steps=100)

    def play(self, fleet: Fleet) -> list[PlayedRun]:
        played = []
        for scn in fleet.runs:
            sink = _Sink(self.ing, fleet.name)
            truth = simulate(scn, sink, speed=0, start_time=scn.start_time)
            self.ing.registry.flush()
            played.append((truth, sink.step_start))
        now = max(t.end_time for t, _ in played) + 3600.0
        for _ in range(400):
            analyze_once(self.tel, self.store, now, self.cfg)
            if not self.store.runs_with_new_data():
                break
        scope = Scope(fleet.name, "viewer")
        return [
            PlayedRun(t, [asdict(r) for r in self.store.rows(scope, t.run_id)], starts)
            for t, starts in played
        ]

    def close(self) -> None:
        self.meta.close()
        self.tel.close()
