"""The stores on the real engines: chDB for telemetry, SQLite and PostgreSQL for metadata."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetlens.collector.decode import decode_batch
from fleetlens.errors import NotFound, StoreError
from fleetlens.services.runs import RunQueries
from fleetlens.store.chdb_store import ChdbStore
from fleetlens.store.metadata import MetadataStore, run_status
from fleetlens.store.scope import Scope
from fleetlens.store.telemetry import batch_tables
from fleetlens.testing import step_batch

pytestmark = pytest.mark.unit


@pytest.fixture
def chdb_store(tmp_path) -> Iterator[ChdbStore]:  # type: ignore[no-untyped-def]
    store = ChdbStore(str(tmp_path / "telemetry"))
    try:
        yield store
    finally:
        store.close()


def _insert(store: ChdbStore, body: bytes, tenant: str = "default") -> None:
    batch = decode_batch(body)
    ctx = dict(batch.ctx, tenant=tenant)
    for kind, table in batch_tables(batch).items():
        store.insert(kind, table, ctx, batch.batch_id)


def test_retried_batch_is_stored_once_including_the_rollup(chdb_store: ChdbStore) -> None:
    _, body = step_batch("r1", range(0, 10), ranks=8)
    for _ in range(3):
        _insert(chdb_store, body)
    rows = chdb_store.query("SELECT count() AS n FROM fleetlens.steps").to_pylist()
    assert rows == [{"n": 80}]
    rollup = chdb_store.query(
        "SELECT sum(ranks) AS r, uniqExact(step) AS s FROM fleetlens.steps_by_step"
    ).to_pylist()
    assert rollup == [{"r": 80, "s": 10}]


def test_summary_counts_a_replayed_step_once_and_uses_the_slowest_rank(
    chdb_store: ChdbStore,
) -> None:
    _insert(chdb_store, step_batch("r1", range(0, 10), 4, job_id="a0", t0=1000.0, slow={2: 1.5})[1])
    # The job failed after step 9; the restart resumes from a checkpoint at step 5.
    _insert(chdb_store, step_batch("r1", range(5, 12), 4, job_id="a1", t0=2000.0, slow={2: 1.5})[1])
    s = RunQueries(chdb_store, Scope("default", "viewer")).summary("r1")
    assert s.step == 11 and s.steps == 12
    assert s.tokens_processed == 12 * 4 * 1000
    assert s.step_time_ms == pytest.approx(600.0)  # the straggler's 0.4 s x 1.5
    assert s.world_size == 4


def test_queries_are_scoped_to_the_tenant(chdb_store: ChdbStore) -> None:
    _insert(chdb_store, step_batch("r1", range(0, 3), 2)[1], tenant="acme")
    assert RunQueries(chdb_store, Scope("other", "viewer")).summary("r1").steps == 0
    assert RunQueries(chdb_store, Scope("acme", "viewer")).summary("r1").steps == 3


def test_second_embedded_store_in_one_process_is_refused(chdb_store, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(StoreError, match="one engine per process"):
        ChdbStore(str(tmp_path / "other"))


T = Scope("t", "viewer")


def test_metadata_registry_on_both_engines(metadata_url: str) -> None:
    store = MetadataStore(metadata_url)
    try:
        store.observe(
            "t", "r1", job_id="a0", project="p", first=10.0, last=20.0, step=5, world_size=8
        )
        store.observe("t", "r1", job_id="a0", first=15.0, last=30.0, step=9)
        store.observe("t", "r1", job_id="a1", first=40.0, last=50.0, step=12)
        store.set_status("t", "r1", "FINISHED", 50.0, config={"lr": 3e-4, "layers": 2})
        info = store.get_run(T, "r1")
        assert (info.first_seen, info.last_seen, info.last_step) == (10.0, 50.0, 12)
        assert info.world_size == 8 and info.jobs == 2 and info.status == "FINISHED"
        assert info.config == {"lr": 3e-4, "layers": 2}
        assert [j.job_id for j in store.jobs(T, "r1")] == ["a0", "a1"]
        assert store.list_runs(Scope("other", "viewer")) == []
        with pytest.raises(NotFound):
            store.get_run(Scope("other", "viewer"), "r1")
        # Reopening an existing database runs no migration twice.
        MetadataStore(metadata_url).close()
    finally:
        store.close()


def test_run_status_rules() -> None:
    assert run_status("FAILED", 100.0, 100.0, now=101.0) == "FAILED"
    # Data after the failure means a restart is running.
    assert run_status("FAILED", 100.0, 150.0, now=151.0) == "RUNNING"
    assert run_status("RUNNING", 0.0, 150.0, now=1000.0) == "STALLED"


def test_a_store_made_before_new_columns_gets_them_on_open(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pyarrow as pa

    path = str(tmp_path / "telemetry")
    old = ChdbStore(path)
    try:  # as an earlier version made them: without the InfiniBand and DCP profiling columns
        old.command(
            "ALTER TABLE fleetlens.node_samples DROP COLUMN ib_errors, DROP COLUMN ib_rx_bytes"
        )
        old.command("ALTER TABLE fleetlens.gpu_samples DROP COLUMN sm_occupancy")
        old.insert_rows("node", pa.table({"tenant": ["t"], "time": [1.0], "node_id": ["n1"]}))
    finally:
        old.close()
    store = ChdbStore(path)
    try:
        new = {"tenant": ["t"], "time": [2.0], "node_id": ["n1"], "ib_errors": [3.0]}
        store.insert_rows("node", pa.table(new))
        rows = store.query(
            "SELECT time, ib_errors FROM fleetlens.node_samples ORDER BY time"
        ).to_pylist()
        cols = store.query("SELECT name FROM system.columns WHERE database = 'fleetlens' "
                           "AND table = 'gpu_samples'").column("name").to_pylist()  # fmt: skip
    finally:
        store.close()
    assert rows[1] == {"time": 2.0, "ib_errors": 3.0} and rows[0]["ib_errors"] != 3.0
    assert "sm_occupancy" in cols


def test_an_insert_does_not_wait_for_a_long_read(chdb_store: ChdbStore) -> None:
    """The collector acknowledges a batch once its insert returns: a read that takes seconds
    (a portal page over a large fleet, an analysis pass) must not hold it. The read here sleeps
    in the engine for 4 s, whatever the machine's pace; the insert returns while it runs."""
    import threading

    read_started, read_done = threading.Event(), threading.Event()

    def long_read() -> None:
        read_started.set()
        chdb_store.query("SELECT sleepEachRow(1) AS s FROM numbers(4) SETTINGS max_block_size = 1")
        read_done.set()

    reader = threading.Thread(target=long_read)
    reader.start()
    read_started.wait(30)
    try:
        _, body = step_batch("during-read", range(0, 5), ranks=2)
        _insert(chdb_store, body)
        assert not read_done.is_set(), "the insert waited for the read to end"
    finally:
        reader.join(30)
    assert read_done.is_set()
    rows = chdb_store.query("SELECT count() AS n FROM fleetlens.steps WHERE run_id = 'during-read'")
    assert rows.to_pylist() == [{"n": 10}]
