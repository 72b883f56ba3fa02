"""The per-step rollup as real ingest leaves it: until the engine merges its parts, a step has one
partial row per insert that held some of its ranks (each rank's SDK batch is its own request).
Every reader of ``steps_by_step`` must add the partial rows up, never take one for the step.
Merges are stopped here so that the partial rows stay, as they do under load."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

from fleetlens.remediation.repository import Repository
from fleetlens.services.portal import PortalQueries
from fleetlens.store.chdb_store import ChdbStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.scope import Scope

pytestmark = pytest.mark.unit

RANKS, STEPS, SLOW = 8, 30, 5
CTX = {"tenant": "acme", "run_id": "r1", "job_id": "a0", "project": "p"}


@pytest.fixture
def store(tmp_path: pytest.TempPathFactory) -> Iterator[ChdbStore]:
    s = ChdbStore(str(tmp_path / "telemetry"))  # type: ignore[operator]
    try:
        s.command("SYSTEM STOP MERGES fleetlens.steps_by_step")
        step = np.arange(STEPS, dtype=np.int64)
        for rank in range(RANKS):  # one insert per rank, as separate SDK requests make
            dur = np.full(STEPS, 1.0 + 0.3 * (rank == SLOW))
            table = pa.table(
                {
                    "step": step,
                    "rank": np.full(STEPS, rank, dtype=np.int32),
                    "time": 1.7e9 + 2.0 * step,
                    "duration": dur,
                    "comm": np.full(STEPS, 0.1),
                    "tokens": np.full(STEPS, 100, dtype=np.int64),
                }
            )
            s.insert("step", table, CTX, f"rank-{rank}")
        yield s
    finally:
        s.close()


def test_the_rollup_holds_a_partial_row_per_rank_insert(store: ChdbStore) -> None:
    rows = store.query("SELECT count() AS n FROM fleetlens.steps_by_step").to_pylist()
    assert rows[0]["n"] == RANKS * STEPS  # the state the readers below must handle


def test_the_run_page_counts_every_rank_and_finds_the_slow_one(store: ChdbStore) -> None:
    pq = PortalQueries(store, Scope("acme", "viewer"))
    assert pq.step_range("r1") == (0, STEPS - 1, RANKS)
    heat = pq.heatmap("r1", 0, STEPS - 1, RANKS, RANKS, STEPS)
    assert heat.rows == RANKS and heat.hot is not None and heat.hot.rank == SLOW
    summary = pq.executions("r1")
    assert len(summary) == STEPS and set(summary.ranks.tolist()) == {RANKS}


def test_restart_cost_reads_whole_steps(store: ChdbStore, tmp_path: pytest.TempPathFactory) -> None:
    meta = MetadataStore(f"sqlite:///{tmp_path}/m.db")
    try:
        durations = Repository(meta, store).step_durations("acme", "r1", 10)
    finally:
        meta.close()
    assert durations == pytest.approx([1.3] * 10)  # the slowest rank's, one per step
