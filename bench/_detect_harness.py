"""The detection harness shared by ``tests/test_detect.py`` and ``bench/detection.py``: play a
simulator scenario with ground truth through the real ingest path into chDB, run the analysis
loop pass after pass as if live, and return what it found.

It lives in ``bench/`` because benchmarks never import ``tests/``; tests import it as
``bench._detect_harness`` (the repository root is on their path).
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from fleetlens.collector.ingest import Ingestor
from fleetlens.config import AnalyzerConfig
from fleetlens.services.analyzer import analyze_once
from fleetlens.sim import load_scenario
from fleetlens.sim.emit import encode
from fleetlens.sim.library import simulate
from fleetlens.sim.truth import GroundTruth
from fleetlens.store.chdb_store import ChdbStore
from fleetlens.store.findings import FindingsStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.scope import Scope

__all__ = ["SCENARIOS", "Bench"]

SCENARIOS = [
    "straggler_persistent", "straggler_intermittent", "straggler_moving", "thermal",
    "rack_cooling", "nvlink", "ecc_xid", "fatal_xid", "network", "data_stall", "nan", "hang",
    "oom", "preemption", "maintenance", "slow_checkpoint",
]  # fmt: skip


class _IngestSink:
    def __init__(self, ingestor: Ingestor, tenant: str) -> None:
        self.ingestor, self.tenant = ingestor, tenant

    def send(self, ctx: dict[str, str], tables: dict[str, Any]) -> None:
        self.ingestor.ingest(encode(ctx, tables), "application/msgpack", "", self.tenant)

    def close(self) -> None:
        pass


class Bench:
    def __init__(self, root: Path) -> None:
        self.tel = ChdbStore(str(root / "telemetry"))
        self.meta = MetadataStore(f"sqlite:///{root}/meta.db")
        self.ing = Ingestor(self.tel, self.meta)
        self.store = FindingsStore(self.meta)

    def run(self, name: str, **job: Any) -> tuple[GroundTruth, list[dict[str, Any]]]:
        scn = load_scenario(name)
        if job:
            scn = replace(scn, job=replace(scn.job, **job))
        # each scenario is its own tenant: device samples are per node, not per run
        truth = simulate(scn, _IngestSink(self.ing, name), speed=0,
                         start_time=time.time() - 2 * 86400)  # fmt: skip
        self.ing.registry.flush()
        for _ in range(100):  # the loop, pass after pass, 100 steps at a time (as if live)
            analyze_once(self.tel, self.store, time.time(), AnalyzerConfig(max_steps=100))
            if not self.store.runs_with_new_data():
                break
        return truth, [asdict(r) for r in self.store.rows(Scope(name, "viewer"), scn.job.run_id)]

    def close(self) -> None:
        self.meta.close()
        self.tel.close()
