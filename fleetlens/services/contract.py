"""A run's measurement contract (:mod:`fleetlens.analysis.contract`, seed 003 s9.3.1): the
software its newest attempt's ranks reported, the topology it was placed on, and the spread of
the project's trials of the same workload. Carried by the run's answer (``GET /v1/runs/{run}``:
step time, MFU), its goodput and a comparison of runs.
"""

from __future__ import annotations

import logging

from ..analysis.baseline import SIGNATURE_KEYS, workload_signature
from ..analysis.contract import Contract, differences, software, topology, trials
from ..errors import StoreError
from ..store.compare_queries import ComparisonQueries
from ..store.detect_queries import DetectQueries
from ..store.metadata import MetadataStore, RunInfo
from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore

__all__ = ["MAX_TRIALS", "compared", "run_contract"]

log = logging.getLogger("fleetlens.contract")

MAX_TRIALS = 50
"""The project's most recently active runs searched for trials of the same workload."""


def run_contract(
    metadata: MetadataStore, telemetry: TelemetryStore, scope: Scope, info: RunInfo
) -> Contract | None:
    """The contract of ``info`` (a run the caller may see); None when the store cannot say
    (a full disk, a busy engine): the answer it rides on stands without it."""
    try:
        return _contract(metadata, telemetry, scope, info)
    except StoreError as exc:
        log.warning("the measurement contract of run %s: %s", info.run_id, exc)
        return None


def _contract(
    metadata: MetadataStore, telemetry: TelemetryStore, scope: Scope, info: RunInfo
) -> Contract:
    q = DetectQueries(telemetry, scope.tenant)
    jobs = q.jobs(info.run_id)
    newest = jobs[-1] if jobs else None
    sw, mixed = software(q.environments(info.run_id, newest.job_id) if newest else [])
    topo = None
    if newest is not None:
        place = q.placement(info.run_id, newest.job_id, newest.world)
        topo = topology(place.node, [int(g) for g in place.gpu], place.nvlink_domain)
    # Trials only of a workload the config names (a model, a batch): the world size alone
    # would make every job of one size a trial of every other.
    same: list[str] = []
    if any(k in (info.config or {}) for k in SIGNATURE_KEYS):
        sig = workload_signature(info.config, info.world_size)  # as each trial's is computed
        same = [
            r.run_id
            for r in metadata.list_runs(scope, info.project, MAX_TRIALS, 0)
            if r.run_id != info.run_id and workload_signature(r.config, r.world_size) == sig
        ]
        same.append(info.run_id)
    medians: dict[str, float] = {}
    if len(same) >= 2:
        speed = ComparisonQueries(TenantReader(telemetry, scope)).speed(same).to_pylist()
        medians = {r["run_id"]: float(r["median_step_s"]) for r in speed if r["median_step_s"]}
    ran = [r for r in same if r in medians]
    return Contract(sw, mixed, topo, trials(ran, [medians[r] for r in ran]))


def compared(contracts: list[Contract]) -> list[list[str]]:
    """Per run after the first, what differs from the first's contract (empty: measured alike)."""
    return [differences(contracts[0], c) for c in contracts[1:]]
