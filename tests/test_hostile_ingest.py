"""Hostile and careless clients against a real server (issue 22): nothing acknowledged is lost,
nothing crosses tenants or runs, and no batch takes the server down."""

from __future__ import annotations

import concurrent.futures
import json
import os
import time
import urllib.parse
import zlib

import msgspec
import numpy as np
import pyarrow as pa
import pytest

from fleetlens.store.access import AccessStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.testing import Server, step_batch, wait_until
from fleetlens.wire import TableBuilder, encode_batch

pytestmark = pytest.mark.e2e


def _runs(server: Server, token: str | None = None) -> dict[str, dict]:  # type: ignore[type-arg]
    return {r["runId"]: r for r in server.get("/v1/runs", token)["runs"]}


def _rss_peak_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))


def test_absurd_ranks_are_refused_and_the_server_keeps_analysing(server: Server) -> None:
    # The probe: a 1-row step batch with rank 2147483647 was stored, then every monitoring
    # pass allocated max(rank)+1 columns and the server died, again after every restart.
    for rank in (2147483647, 16_000_000):
        row = {"step": [1], "rank": [rank], "time": [time.time()], "duration": [0.5]}
        body = json.dumps(
            {"v": 1, "batch_id": f"r{rank}", "ctx": {"run_id": "evil"},
             "tables": {"step": {"n": 1, "cols": row}}}
        ).encode()  # fmt: skip
        status, err, _ = server.post(body, "application/json")
        assert status == 400 and err["field"] == "tables.step.cols.rank", err
        assert "max_world_size" in err["error"]
    pl = TableBuilder("placement")  # WORLD_SIZE=16000000 in an SDK run
    pl.add("time", [time.time()]).add("rank", [0]).add("world_size", [16_000_000])
    pl.add("node_id", ["n1"])
    status, err, _ = server.post(encode_batch({"placement": pl.build()}, {"run_id": "evil"})[1])
    assert status == 400 and err["field"] == "tables.placement.cols.world_size"
    # A good run next to it is ingested and analysed; the server is alive and small.
    assert server.post(step_batch("good", range(0, 40), 8)[1])[0] == 200
    assert server.get("/healthz")["status"] == "ok"
    assert "evil" not in _runs(server)
    assert server.proc is not None and _rss_peak_kb(server.proc.pid) < 1_500_000


def test_analysis_allocates_by_the_ranks_seen_not_the_largest_rank(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Rows stored before the collector refused them must not take the analysis down either.
    from fleetlens.store.chdb_store import ChdbStore
    from fleetlens.store.detect_queries import DetectQueries

    store = ChdbStore(str(tmp_path / "t"))
    try:
        n = 4
        tab = pa.table(
            {
                "step": pa.array([1] * n + [2], pa.int64()),
                "rank": pa.array([0, 1, 2, 3, 2147483647], pa.int32()),
                "time": pa.array([1.7e9] * (n + 1)),
                "duration": pa.array([0.5] * (n + 1)),
            }
        )
        store.insert("step", tab, {"tenant": "default", "run_id": "r", "job_id": "j"}, "b1")
        q = DetectQueries(store, "default")
        m = q.step_matrix("r", "j", 0, 10, 4)
        assert m.world == 4 and m.compute.shape == (1, 4)
        assert q.placement("r", "j", m.world).of(2147483647) == ("", -1, "")
        # A worker of a wider formation that was placed but never stepped (a node lost while the
        # job re-formed) has no column: the placement stays as wide as the matrix it labels.
        pl = pa.table({"time": pa.array([1.7e9] * 5), "rank": pa.array(range(5), pa.int32()),
                       "node_id": pa.array(["a", "a", "b", "b", "c"])})  # fmt: skip
        store.insert("placement", pl, {"tenant": "default", "run_id": "r", "job_id": "j"}, "b2")
        # A reader is one pass's read: what it loaded stays (the stages of a pass judge the same
        # rows); the next pass reads anew.
        assert q.placement("r", "j", m.world).node == [""] * 4
        place = DetectQueries(store, "default").placement("r", "j", m.world)
        assert len(place.node) == len(place.rack) == m.compute.shape[1] == 4
        assert place.of(3)[0] == "b" and place.of(4) == ("", -1, "")
    finally:
        store.close()


def test_the_same_batch_id_from_another_tenant_or_run_is_stored(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = str(tmp_path / "d")
    os.makedirs(data)
    meta = MetadataStore(f"sqlite:///{data}/metadata.db")
    access = AccessStore(meta)
    tok = {t: access.create_token(t, "admin", name=t)[0] for t in ("acme", "bolt")}
    meta.close()
    server = Server(data, extra_args=("--auth", "required")).start()
    try:
        # Tenant A's batch id made tenant B's different batch vanish, answered "stored".
        _, a = step_batch("shared", range(0, 5), 2, batch_id="import-1")
        _, b = step_batch("shared", range(0, 7), 3, batch_id="import-1")
        assert server.post(a, token=tok["acme"])[0] == 200
        assert server.post(b, token=tok["bolt"])[0] == 200
        assert server.get("/v1/runs/shared", tok["acme"])["steps"] == 5
        assert server.get("/v1/runs/shared", tok["bolt"])["steps"] == 7
        # Two runs of one tenant (importers derive batch ids from run id and file path).
        _, c = step_batch("other", range(0, 3), 2, batch_id="import-1")
        assert server.post(c, token=tok["acme"])[0] == 200
        assert server.get("/v1/runs/other", tok["acme"])["steps"] == 3
        # Same run, same id, different content: not a retry, stored.
        t0 = time.time() - 60
        _, d = step_batch("shared", range(5, 9), 2, batch_id="import-1", t0=t0)
        assert server.post(d, token=tok["acme"])[0] == 200
        assert server.get("/v1/runs/shared", tok["acme"])["steps"] == 9
        # A true retry (re-encoded, so even sent_at differs) is still stored once.
        _, again = step_batch("shared", range(5, 9), 2, batch_id="import-1", t0=t0)
        assert again != d and server.post(again, token=tok["acme"])[0] == 200
        assert server.post(d, token=tok["acme"])[0] == 200
        run = server.get("/v1/runs/shared", tok["acme"])
        assert run["steps"] == 9 and run["tokensProcessed"] == 9 * 2 * 1000
        assert server.get("/v1/runs/shared", tok["bolt"])["tokensProcessed"] == 7 * 3 * 1000
    finally:
        server.stop()


def test_a_bad_hint_is_a_4xx_before_anything_is_written(server: Server) -> None:
    # The probe: checkpoint_end attrs {"step": "abc"} answered 500 after the rows were stored,
    # so the SDK retried it forever and everything spooled behind it was stuck.
    def event(kind: str, attrs: dict[str, object], with_steps: bool, run: str) -> bytes:
        ev = TableBuilder("event")
        ev.add("time", [time.time()]).add("kind", [kind]).add("attrs", [json.dumps(attrs)])
        tables = {"event": ev.build()}
        if with_steps:
            steps = msgspec.msgpack.decode(step_batch(run, range(0, 3), 2)[1])["tables"]["step"]
            tables["step"] = msgspec.convert(steps, type(ev.build()))
        return encode_batch(tables, {"run_id": run, "job_id": "j1"})[1]

    for kind, attrs in [
        ("checkpoint_end", {"step": "abc"}),
        ("checkpoint_end", {"size_bytes": 2**70}),
        ("job_start", {"code": 12345}),
    ]:
        status, err, _ = server.post(event(kind, attrs, False, "hinted"))
        assert status == 400 and err["field"] == "tables.event.cols.attrs", (status, err)
    assert "hinted" not in _runs(server)  # nothing of them was written
    status, ack, _ = server.post(event("checkpoint_end", {"step": "abc"}, True, "hinted"))
    assert status == 200 and ack["rows"] == {"event": 0, "step": 6}
    assert ack["rejected"] == {"tables.event.cols.attrs": 1}
    assert server.get("/v1/runs/hinted")["steps"] == 3


def test_a_bad_record_is_refused_alone(server: Server) -> None:
    # run.log(-1, loss=1.0) refused 5,271 good records of its batch.
    n = 5272
    tb = TableBuilder("scalar")
    tb.add("step", [-1, *range(n - 1)]).add("time", [time.time()] * n)
    tb.add("name", ["loss"] * n).add("value", [1.0] * n)
    ev = TableBuilder("event")  # and a 70,000-character message took 426 steps with it
    ev.add("time", [time.time()]).add("kind", ["custom"]).add("message", ["x" * 70_000])
    steps = msgspec.msgpack.decode(step_batch("alone", range(0, 213), 2)[1])["tables"]["step"]
    tables = {
        "scalar": tb.build(),
        "event": ev.build(),
        "step": msgspec.convert(steps, type(tb.build())),
    }
    status, ack, _ = server.post(encode_batch(tables, {"run_id": "alone"})[1])
    assert status == 200, ack
    assert ack["rows"] == {"scalar": n - 1, "event": 0, "step": 426}
    assert ack["rejected"] == {"tables.scalar.cols.step": 1, "tables.event.cols.message": 1}
    assert len(ack["errors"]) == 2
    got = server.get("/v1/runs/alone/metrics?name=loss&points=100000")
    assert len(got["points"]) == n - 1 and server.get("/v1/runs/alone")["steps"] == 213


def test_names_and_ids_outside_the_alphabet_are_refused_and_reads_never_503(
    server: Server,
) -> None:
    # Scalar names with a tab or a newline were stored, then every read of them answered 503;
    # run ids with '/' were stored, then 404 everywhere.
    tb = TableBuilder("scalar")
    names = ["bad\tname", "bad\nname", "back\\tslash", "it's"]
    tb.add("step", [1] * 4).add("time", [time.time()] * 4).add("name", names)
    tb.add("value", [1.0, 2.0, 3.0, 4.0])
    status, ack, _ = server.post(encode_batch({"scalar": tb.build()}, {"run_id": "names"})[1])
    assert status == 200 and ack["rejected"] == {"tables.scalar.cols.name": 2}
    listed = server.get("/v1/runs/names/metrics")["metrics"]
    assert sorted(m["name"] for m in listed) == sorted(names[2:])
    for name in names:  # every read answers: the stored ones with their value, the others empty
        got = server.get("/v1/runs/names/metrics?name=" + urllib.parse.quote(name))
        assert [p["value"] for p in got["points"]] == ([] if "\t" in name or "\n" in name else
                                                      [float(names.index(name) + 1)])  # fmt: skip
    status, err, _ = server.post(step_batch("team/run", range(0, 2), 1)[1])
    assert status == 400 and err["field"] == "ctx.run_id" and "'/'" in err["error"]


def test_the_registry_is_current_after_sigkill(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # 1,000 steps acknowledged, lastStep 99 after a SIGKILL and a restart.
    data = str(tmp_path / "d")
    server = Server(data).start()
    port = server.port
    t0 = time.time() - 600
    for i in range(10):
        _, body = step_batch("reg", range(i * 100, (i + 1) * 100), 2, job_id="a0", t0=t0 + i * 48)
        assert server.post(body)[0] == 200
    server.kill()
    server = Server(data, port=port).start()
    try:
        run = _runs(server)["reg"]
        assert run["lastStep"] == 999, run
        assert run["lastSeen"] >= t0 + 9 * 48 + 99 * 0.48
    finally:
        server.stop()


def test_concurrent_gzip_bombs_do_not_blow_up_the_server(server: Server) -> None:
    # Four concurrent 1 MB -> 1 GiB bombs: 413, and the server's peak memory stays bounded.
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\x00" * (16 << 20)
    bomb = b"".join(z.compress(chunk) for _ in range(64)) + z.flush()
    assert server.proc is not None
    before = _rss_peak_kb(server.proc.pid)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: server.post(bomb, encoding="gzip"), range(4)))
    assert [r[0] for r in results] == [413] * 4
    assert "decompressed" in results[0][1]["error"]
    grew_mb = (_rss_peak_kb(server.proc.pid) - before) / 1024
    assert grew_mb < 700, grew_mb  # 2 decode slots x the 256 MiB limit, not 4 x 4 GiB
    assert server.post(step_batch("after-bombs", range(0, 3), 2)[1])[0] == 200


def test_a_big_valid_body_costs_about_its_decoded_size(server: Server) -> None:
    # A 1.5 MB gzip body expanding to 3.9M rows cost 1.2 GB.
    n = 3_900_000
    tb = TableBuilder("step")
    tb.add_packed("step", np.repeat(np.arange(n // 1000, dtype="<i8"), 1000).tobytes())
    tb.add_packed("rank", np.tile(np.arange(1000, dtype="<i4"), n // 1000).tobytes())
    tb.add_packed("time", np.full(n, time.time() - 60, dtype="<f8").tobytes())
    tb.add_packed("duration", np.full(n, 0.5, dtype="<f8").tobytes())
    _, body = encode_batch({"step": tb.build()}, {"run_id": "wide"}, compress=True)
    assert len(body) < 8 << 20
    assert server.proc is not None
    before = _rss_peak_kb(server.proc.pid)
    status, ack, _ = server.post(body, encoding="gzip")
    assert status == 200 and ack["rows"]["step"] == n
    grew_mb = (_rss_peak_kb(server.proc.pid) - before) / 1024
    assert grew_mb < 800, grew_mb


def test_clock_skew_is_corrected_or_flagged(server: Server) -> None:
    # A live run 2 h behind became STALLED with a hang; one rank a year ahead made goodput's
    # wall time a year.
    now = time.time()
    tb = TableBuilder("step")
    tb.add("step", [1, 2]).add("rank", [0, 0]).add("time", [now - 7200, now - 7199.5])
    tb.add("duration", [0.4, 0.4])
    raw = msgspec.msgpack.decode(encode_batch({"step": tb.build()}, {"run_id": "late"})[1])
    raw["sent_at"] = now - 7199
    body = msgspec.msgpack.encode(raw)
    # Without a transmission stamp it may be a replayed batch: stored as sent, and flagged.
    status, ack, _ = server.post(body)
    assert status == 200 and 7100 < ack["clockSkewS"] < 7300 and ack["timeShiftS"] == 0
    # Stamped at transmission (X-Fleetlens-Sent-At): the skew is certain, the times corrected.
    raw.update(batch_id="late-2", ctx={"run_id": "late2"})
    import urllib.request

    req = urllib.request.Request(
        server.url + "/v1/ingest", data=msgspec.msgpack.encode(raw), method="POST"
    )
    req.add_header("Content-Type", "application/msgpack")
    req.add_header("X-Fleetlens-Sent-At", str(now - 7199))
    with urllib.request.urlopen(req, timeout=30) as r:
        ack = json.load(r)
    assert 7100 < ack["timeShiftS"] < 7300
    late2 = wait_until(lambda: _runs(server).get("late2"), what="run late2")
    assert late2["lastSeen"] > now - 60 and late2["status"] == "RUNNING"
    # A rank a year ahead: its sent_at is a year ahead too, which no replay explains: corrected.
    year = 365 * 86400.0
    tb = TableBuilder("step")
    tb.add("step", [1]).add("rank", [0]).add("time", [now + year]).add("duration", [0.4])
    raw = msgspec.msgpack.decode(encode_batch({"step": tb.build()}, {"run_id": "ahead"})[1])
    raw["sent_at"] = now + year + 1
    status, ack, _ = server.post(msgspec.msgpack.encode(raw))
    assert status == 200 and ack["timeShiftS"] < -year + 60
    assert _runs(server)["ahead"]["lastSeen"] < time.time() + 60


def test_an_sdk_run_keeps_its_good_rows_and_counts_the_one_refused(
    server: Server, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # run.log(-1, loss=1.0) once cost the whole batch; now the server refuses that row alone
    # and the job's own stats say so.
    import fleetlens

    run = fleetlens.init(
        project="p",
        run_id="sdk-alone",
        server=server.url,
        spool_dir=str(tmp_path / "spool"),
        flush_interval=0.05,
        install_signal_handler=False,
    )
    run.log(-1, loss=1.0)
    for step in range(50):
        run.log(step, loss=1.0 / (step + 1))
    run.finish()
    stats = run.stats()
    assert stats["refused_rows"] == 1 and stats["rejected_batches"] == 0, stats
    assert stats["records_sent"] == stats["records"] and stats["spool_files"] == 0, stats
    got = server.get("/v1/runs/sdk-alone/metrics?name=loss")["points"]
    assert [p["step"] for p in got] == list(range(50))
