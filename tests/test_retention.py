"""Retention and rollups: per-table TTLs reach the DDL (new and existing tables), expired rows
go while the rollups and the preserved failure windows stay, long windows read the rollups and
agree with the raw rows, and ``/metrics`` shows the operator the bytes stored per table."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from fleetlens.alerts.models import Preservation
from fleetlens.alerts.preserve import preserve_window
from fleetlens.config import RetentionConfig, ServerConfig
from fleetlens.errors import ConfigError
from fleetlens.services.preserved import PreservedWindows
from fleetlens.services.series import SeriesQueries
from fleetlens.store.access import AccessStore
from fleetlens.store.chdb_store import ChdbStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.retention import retention_days, stored_bytes
from fleetlens.store.scope import Scope
from fleetlens.testing import Server, step_batch

pytestmark = pytest.mark.unit

ACME = Scope(tenant="acme", role="admin", actor="alice")
DAY = 86_400.0


def _ttls(store: ChdbStore) -> dict[str, str]:
    rows = store.query(
        "SELECT name, create_table_query AS q FROM system.tables WHERE database = 'fleetlens'"
    ).to_pylist()
    out = {}
    for r in rows:
        q = r["q"]
        out[r["name"]] = q[q.index(" TTL ") + 5 : q.index(" SETTINGS")] if " TTL " in q else ""
    return out


def test_the_retention_setting_is_parsed_checked_and_mapped_to_tables() -> None:
    cfg = ServerConfig.resolve({"retention": "raw=14,gpu=7,events=90,rollups=0"}, environ={})
    days = dict(retention_days(cfg.retention))
    assert days["steps"] == days["scalars"] == 14 and days["gpu_samples"] == 7
    assert days["events"] == 90 and "rollup_scalars_1m" not in days  # 0 keeps forever
    assert "placement" not in days and not any(t.startswith("preserved") for t in days)
    env = ServerConfig.resolve(environ={"FLEETLENS_RETENTION_DAYS": "3"}).retention
    assert dict(retention_days(env))["collectives"] == 3
    assert dict(retention_days(env))["rollup_gpu_10s"] == 365
    for bad in ("steps", "steps=-1", "preserved_steps=5", "nope=3"):
        with pytest.raises(ConfigError):
            ServerConfig.resolve({"retention": bad}, environ={})


def test_ttls_reach_new_and_existing_tables_and_never_the_preserved(tmp_path: Path) -> None:
    path = str(tmp_path / "telemetry")
    store = ChdbStore(path)  # a store opened without a retention: no TTL anywhere
    assert not any(_ttls(store).values())
    store.close()
    store = ChdbStore(path, retention=retention_days(RetentionConfig(tables="steps=7")))
    try:
        ttl = _ttls(store)
        assert ttl["steps"] == "greatest(toDateTime(time), _stored) + toIntervalDay(7)"
        assert ttl["scalars"].endswith("toIntervalDay(30)")
        assert ttl["collectives"].startswith("greatest(toDateTime(enter)")
        assert ttl["rollup_scalars_1m"].endswith("toIntervalDay(365)")
        assert not ttl["events"] and not ttl["placement"] and not ttl["steps_by_step"]
        assert not any(v for k, v in ttl.items() if k.startswith("preserved_"))
    finally:
        store.close()
    # Reopened under another retention, the existing tables change; a store opened by a tool
    # that names none leaves them as they are.
    store = ChdbStore(path, retention=retention_days(RetentionConfig(raw_days=0, tables="gpu=3")))
    store.close()
    store = ChdbStore(path)
    try:
        ttl = _ttls(store)
        assert not ttl["steps"] and not ttl["scalars"]
        assert ttl["gpu_samples"].endswith("toIntervalDay(3)")
    finally:
        store.close()


@pytest.fixture
def aged(tmp_path: Path) -> Iterator[tuple[ChdbStore, MetadataStore]]:
    store = ChdbStore(str(tmp_path / "telemetry"), retention=retention_days(RetentionConfig()))
    meta = MetadataStore(f"sqlite:///{tmp_path}/metadata.db")
    yield store, meta
    meta.close()
    store.close()


def _fill(store: ChdbStore, t0: float) -> None:
    """An 8-hour run 40 days ago (imported: its rows stored now): 2 ranks log a loss every
    30 s, with a NaN at step 100; per-rank steps with tokens; GPU samples on one node."""
    n = 960
    steps = [s for s in range(n) for _ in range(2)]
    ranks = [r for _ in range(n) for r in range(2)]
    times = [t0 + 30.0 * s + 0.1 * r for s, r in zip(steps, ranks, strict=True)]
    pairs = list(zip(steps, ranks, strict=True))
    loss = [math.nan if s == 100 else 4.0 - s / 512 + r / 8 for s, r in pairs]
    ctx = {"tenant": "acme", "project": "llm", "run_id": "old", "job_id": "j1"}
    cols = {"step": steps, "rank": ranks, "time": times, "name": ["loss"] * len(steps)}
    store.insert("scalar", pa.table({**cols, "value": loss}), ctx, "s1")
    dur = [1.0 + (s % 7) / 8 + r / 4 for s, r in zip(steps, ranks, strict=True)]
    step_cols = {"step": steps, "rank": ranks, "time": times, "duration": dur}
    store.insert("step", pa.table({**step_cols, "tokens": [4096] * len(steps)}), ctx, "t1")
    gpu = {"time": [t0 + 15.0 * i for i in range(2 * n)], "node_id": ["n1"] * (2 * n)}
    util = [float(i % 100) if i % 9 else math.nan for i in range(2 * n)]
    store.insert("gpu", pa.table({**gpu, "gpu": [0] * (2 * n), "gpu_util": util}), ctx, "g1")


def _count(store: ChdbStore, table: str) -> int:
    return int(store.query(f"SELECT count() AS n FROM fleetlens.{table}").to_pylist()[0]["n"])


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], float):
                assert x[k] == pytest.approx(y[k], rel=1e-12, nan_ok=True), (k, x, y)
            else:
                assert x[k] == y[k], (k, x, y)


def test_long_windows_read_the_rollups_which_agree_with_the_raw_rows(
    aged: tuple[ChdbStore, MetadataStore],
) -> None:
    store, _ = aged
    t0 = math.floor(time.time() / 60) * 60 - 40 * DAY
    _fill(store, t0)
    q = SeriesQueries(store, ACME)
    doc = q.read("old", "loss", 0, 2**62, 1000)  # 8 h in 1000 points: 30 s buckets
    assert doc.resolution == "10s" and doc.to_step == 959
    assert len(doc.points) == 960 and doc.points[100].non_finite == 2
    for res, points in (("10s", 1000), ("1m", 200), ("1m", 7)):
        raw = q.over_time("old", "loss", t0, t0 + 8 * 3600, points, res, raw=True)
        rolled = q.over_time("old", "loss", t0, t0 + 8 * 3600, points, res)
        _same([asdict(p) for p in raw], [asdict(p) for p in rolled])
    assert q.read("old", "loss", 0, 2**62, 200).resolution == "1m"
    # A short window stays raw, one point per step: the lowest rank's value.
    short = q.read("old", "loss", 10, 19, 1000)
    assert short.resolution == "raw" and [p.value for p in short.points] == [
        4.0 - s / 512 for s in range(10, 20)
    ]
    # The step and GPU rollups hold what the raw rows give per minute.
    raw_steps = store.query(
        "SELECT toInt64(floor(time / 60)) * 60 AS b, count() AS n, sum(tokens) AS tok,"
        " max(duration) AS mx, sum(duration) AS sm FROM fleetlens.steps GROUP BY b ORDER BY b"
    ).to_pylist()
    rolled = store.query(
        "SELECT bucket AS b, sum(rank_steps) AS n, sum(tokens) AS tok, max(max_duration) AS mx,"
        " sum(sum_duration) AS sm FROM fleetlens.rollup_steps_1m GROUP BY b ORDER BY b"
    ).to_pylist()
    _same(raw_steps, rolled)
    raw_gpu = store.query(
        "SELECT toInt64(floor(time / 10)) * 10 AS b, avgIf(gpu_util, isFinite(gpu_util)) AS u"
        " FROM fleetlens.gpu_samples GROUP BY b ORDER BY b"
    ).to_pylist()
    rolled_gpu = store.query(
        "SELECT bucket AS b, sum(gpu_util_sum) / sum(gpu_util_n) AS u"
        " FROM fleetlens.rollup_gpu_10s GROUP BY b ORDER BY b"
    ).to_pylist()
    _same(raw_gpu, rolled_gpu)


def test_expired_rows_go_and_the_rollups_and_preserved_windows_stay(
    aged: tuple[ChdbStore, MetadataStore],
) -> None:
    store, meta = aged
    t0 = math.floor(time.time() / 60) * 60 - 40 * DAY
    _fill(store, t0)
    meta.observe("acme", "old", job_id="j1", project="llm", first=t0, last=t0 + 8 * 3600, step=959)
    # An imported run keeps its rows: retention counts from when they were stored.
    for t in ("steps", "scalars", "gpu_samples"):
        store.command(f"OPTIMIZE TABLE fleetlens.{t} FINAL")
    assert _count(store, "scalars") == 1920 and _count(store, "steps") == 1920
    failed_at = t0 + 4 * 3600
    preserve_window(store, "acme", "old", ["n1"], failed_at - 600, failed_at + 600, "w1")
    with meta.session() as s:
        w0, w1 = failed_at - 600, failed_at + 600
        s.add(Preservation(tenant="acme", run_id="old", nodes=["n1"], fingerprint="f",
                           t0=w0, t1=w1, copied_until=w1))  # fmt: skip
        s.commit()
    q = SeriesQueries(store, ACME)
    before = q.read("old", "loss", 0, 2**62, 200)
    rollups = {t: _count(store, t) for t in ("rollup_scalars_1m", "rollup_steps_10s")}

    # Forty days later: the rows were stored 40 days ago, past the 30 days kept.
    for t in ("steps", "scalars", "gpu_samples"):
        store.command(
            f"ALTER TABLE fleetlens.{t} UPDATE _stored = now() - INTERVAL 40 DAY WHERE 1"
            " SETTINGS mutations_sync = 1"
        )
        store.command(f"OPTIMIZE TABLE fleetlens.{t} FINAL")
        assert _count(store, t) == 0, t
    for t in ("rollup_scalars_1m", "rollup_steps_10s", "preserved_steps"):
        store.command(f"OPTIMIZE TABLE fleetlens.{t} FINAL")
    assert {t: _count(store, t) for t in rollups} == rollups

    after = q.read("old", "loss", 0, 2**62, 200)
    assert after == before and after.resolution == "1m"
    assert [m.name for m in q.names("old")] == ["loss"]
    short = q.read("old", "loss", 10, 19, 1000)  # raw rows gone: the 10 s rollup answers
    assert short.resolution == "10s" and short.points[0].step == 10

    windows = PreservedWindows(meta, store, ACME)
    (win,) = windows.list("old").windows
    assert win.kept["steps"] == 80 and win.kept["scalars"] == 80
    assert win.kept["gpu_samples"] == 80
    rows = windows.rows("old", win.id, "steps", limit=5)
    assert rows.total == 80 and rows.rows[0]["time"] >= failed_at - 600
    assert "_stored" not in rows.rows[0]
    assert stored_bytes(store)["preserved_steps"] > 0


@pytest.mark.e2e  # the flag as `fleetlens serve` parses it
def test_the_retention_flag_reaches_the_ddl_and_metrics_show_the_operator_stored_bytes(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "data")
    Path(data).mkdir()
    meta = MetadataStore(f"sqlite:///{data}/metadata.db")
    access = AccessStore(meta)
    admin = access.create_token("acme", "admin", name="a")[0]
    oncall = access.create_token("ops", "oncall", name="o")[0]
    meta.close()
    server = Server(data, extra_args=("--auth", "required", "--retention", "steps=9,rollups=400"))
    server.start()
    try:
        _, body = step_batch("r1", range(0, 5), 2)
        assert server.post(body, token=admin)[0] == 200
        status, text = server.request("GET", "/metrics", token=oncall)
        assert status == 200
        sizes = {
            line.split('"')[1]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("fleetlens_stored_bytes{")
        }
        assert sizes["steps"] > 0 and "steps_by_step" in sizes
        status, text = server.request("GET", "/metrics", token=admin)
        assert status == 200 and "fleetlens_stored_bytes" not in text  # a tenant's view
    finally:
        server.stop()
    store = ChdbStore(f"{data}/telemetry")
    try:
        ttl = _ttls(store)
        assert ttl["steps"].endswith("toIntervalDay(9)")
        assert ttl["scalars"].endswith("toIntervalDay(30)")
        assert ttl["rollup_steps_1m"].endswith("toIntervalDay(400)")
    finally:
        store.close()
