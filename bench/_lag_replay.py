"""Play a simulator scenario as a sender that lags behind its own timestamps.

Every record goes through the real ingest path into chDB in the order of its own time, slice
by slice (``tick`` seconds of data each), but the server's monitoring pass (analysis, alert
policy) runs at ``now = data time + lag``: the sender is ``lag`` seconds behind, as a
congested network, a relay replaying its spool or a simulator played at ``--speed 2`` make
it. What the run did must not change with the lag: the hangs found are the ones injected.

Shared by ``tests/test_hang_lag.py`` and ``bench/detection.py`` (benchmarks never import
``tests/``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetlens.alerts.metrics import JobMetrics
from fleetlens.alerts.notifiers import AlertPayload, Delivery
from fleetlens.alerts.policy import DEFAULT_POLICY
from fleetlens.alerts.store import AlertStore
from fleetlens.collector.ingest import Ingestor
from fleetlens.services.monitor import Monitor
from fleetlens.sim import load_scenario
from fleetlens.sim.emit import by_data_time, encode
from fleetlens.sim.library import simulate
from fleetlens.sim.model import Scenario
from fleetlens.sim.truth import GroundTruth
from fleetlens.store.access import AccessStore
from fleetlens.store.chdb_store import ChdbStore
from fleetlens.store.findings import FindingRow, FindingsStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.scope import Scope

__all__ = ["LagReplay", "Played"]


@dataclass
class _Recorder:
    name: str = "recorder"
    sent: list[AlertPayload] = field(default_factory=list)

    def send(self, alerts: list[AlertPayload]) -> None:
        self.sent += alerts


@dataclass
class Played:
    truth: GroundTruth
    findings: list[FindingRow]
    pages: list[AlertPayload]  # alerts that fired

    @property
    def hangs(self) -> list[FindingRow]:
        return [f for f in self.findings if f.diagnosis == "hang"]

    def false_hangs(self) -> int:
        """Hang findings and JobHang alerts beyond the hangs injected (one each per hang)."""
        injected = sum(1 for f in self.truth.faults if f.kind == "hang")
        alerts = len({a.fingerprint for a in self.pages if a.labels["alertname"] == "JobHang"})
        return max(0, len(self.hangs) - injected) + max(0, alerts - injected)

    def hang_found(self) -> bool:
        steps = {f.step for f in self.hangs}
        return all(f.start_step in steps for f in self.truth.faults if f.kind == "hang")


class LagReplay:
    def __init__(self, root: Path, tick: float = 60.0) -> None:
        self.tel = ChdbStore(str(root / "telemetry"))
        self.meta = MetadataStore(f"sqlite:///{root}/meta.db")
        self.ing = Ingestor(self.tel, self.meta)
        self.rec = _Recorder()
        self.delivery = Delivery([self.rec])
        self.findings = FindingsStore(self.meta)
        self.mon = Monitor(self.tel, self.meta, self.findings, AlertStore(self.meta,
                           AccessStore(self.meta)), self.delivery, JobMetrics(),
                           DEFAULT_POLICY)  # fmt: skip
        self.tick = tick
        self.batches: list[tuple[dict[str, str], dict[str, Any]]] = []

    def send(self, ctx: dict[str, str], tables: dict[str, Any]) -> None:
        self.batches.append((ctx, tables))

    def close(self) -> None:
        pass

    def play(self, scenario: str | Scenario, lag: float, tenant: str | None = None) -> Played:
        """Play a scenario (a shipped name or one built here) with the sender ``lag`` seconds
        behind its timestamps."""
        scn = load_scenario(scenario) if isinstance(scenario, str) else scenario
        tenant = tenant or f"{scn.name}-{lag:g}"
        self.batches, self.rec.sent = [], []
        truth = simulate(scn, self, speed=0, start_time=time.time() - 2 * 86400)
        t0 = truth.start_time
        slices = by_data_time(self.batches, t0, self.tick)
        for b in sorted(slices):
            for ctx, tables in slices[b]:
                self.ing.ingest(encode(ctx, tables), "application/msgpack", "", tenant)
            self.ing.registry.flush()
            # The slice of data time [b, b + 1) ticks has just arrived, ``lag`` late.
            self.mon.run_once(now=t0 + (b + 1) * self.tick + lag)
            self.delivery.wait_idle(10.0)
        for k in range(1, 11):  # ten more minutes of the server's clock, no more data
            self.mon.run_once(now=truth.end_time + lag + k * 60.0)
            self.delivery.wait_idle(10.0)
        rows = self.findings.rows(Scope(tenant, "viewer"), truth.run_id)
        return Played(truth, rows, [a for a in self.rec.sent if a.ends_at is None])

    def shutdown(self) -> None:
        self.delivery.close()
        self.meta.close()
        self.tel.close()
