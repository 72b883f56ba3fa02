"""Real traffic on the collector: group commit, its ledger across SIGKILL, pacing, token cache.

The server is ``fleetlens serve`` on loopback with the embedded engine; the crash windows of the
ledger are played against the real engine in-process (an insert that returned, one that never
ran, one stored in part) and across a real SIGKILL under many concurrent senders.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetlens.collector.commit import GroupCommitter
from fleetlens.collector.ledger import Ledger, batch_key
from fleetlens.collector.pacing import Pacer
from fleetlens.store.batch import StringColumn
from fleetlens.store.chdb_store import ChdbStore
from fleetlens.store.telemetry import Part, merged_table, slice_columns
from fleetlens.testing import Server, step_batch, wait_until

pytestmark = pytest.mark.e2e


def _metric(server: Server, name: str) -> float:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not on /metrics")


def test_concurrent_small_batches_share_inserts_and_each_is_stored_once(
    server: Server,
) -> None:
    # 48 senders at once, SDK-sized batches (one step of 8 ranks): every one acknowledged and
    # stored, in far fewer inserts than requests.
    bodies = [step_batch(f"gc-{i % 4}", range(i, i + 1), 8)[1] for i in range(240)]
    with concurrent.futures.ThreadPoolExecutor(48) as pool:
        results = list(pool.map(server.post, bodies))
    assert [r[0] for r in results] == [200] * 240
    assert all(r[1]["rows"] == {"step": 8} and r[1]["flushS"] >= 0 for r in results)
    commits = _metric(server, "fleetlens_ingest_commits_total")
    requests = _metric(server, "fleetlens_ingest_committed_requests_total")
    assert requests == 240 and commits < requests * 0.8, (commits, requests)
    for run in range(4):
        assert server.get(f"/v1/runs/gc-{run}")["steps"] == 60
    # The same batches again (retries): acknowledged, not stored twice.
    with concurrent.futures.ThreadPoolExecutor(48) as pool:
        again = list(pool.map(server.post, bodies[:96]))
    assert [r[0] for r in again] == [200] * 96
    assert _metric(server, "fleetlens_ingest_deduplicated_tables_total") >= 96
    ranks = server.get("/v1/runs/gc-0/ranks?fromStep=0&toStep=300")["ranks"]
    assert {r["steps"] for r in ranks} == {60}


def test_a_bad_batch_in_a_crowd_is_refused_alone(server: Server) -> None:
    good = [step_batch("crowd", range(i, i + 1), 4)[1] for i in range(30)]
    bad = b"\x92\x01\x02"  # msgpack, but not a batch
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(server.post, [*good[:15], bad, *good[15:]]))
    codes = [r[0] for r in results]
    assert codes.count(200) == 30 and codes[15] == 400
    assert server.get("/v1/runs/crowd")["steps"] == 30


def _count(store: ChdbStore, run: str) -> int:
    t = store.query(f"SELECT count() AS n FROM fleetlens.steps WHERE run_id = '{run}'")
    return int(t.column("n")[0].as_py())


def _in_views(store: ChdbStore, run: str) -> list[int]:
    """Rank-steps of ``run`` as each view of the steps table counts them."""
    counts = []
    for table, col in (("steps_by_step", "ranks"), ("rollup_steps_10s", "rank_steps"),
                       ("rollup_steps_1m", "rank_steps")):  # fmt: skip
        t = store.query(f"SELECT sum({col}) AS n FROM fleetlens.{table} WHERE run_id = '{run}'")
        counts.append(int(t.column("n")[0].as_py() or 0))
    return counts


def _piece(run: str, batch: str, rows: int) -> tuple[str, Part]:
    ctx = {"tenant": "default", "run_id": run, "job_id": "j"}
    cols: dict[str, Any] = {
        "step": np.arange(rows, dtype=np.int64),
        "rank": np.zeros(rows, dtype=np.int32),
        "time": np.full(rows, 1.7e9),
        "duration": np.full(rows, 0.5),
    }
    key = batch_key(ctx, batch, "step", "d")
    return "step", (ctx, cols, rows, key)


def test_string_columns_of_many_batches_share_one_insert(tmp_path: Path) -> None:
    # Each batch brings its own dictionary of names (one a careless client's, with a word
    # twice): merged, every word must be in the insert's dictionary once, or the engine refuses
    # the whole group.
    store = ChdbStore(str(tmp_path / "t"))
    try:
        dictionaries = [["loss", "lr"], ["lr", "grad_norm", "loss"], ["loss", "loss", "mfu"]]
        parts: list[Part] = []
        want = []
        for b, words in enumerate(dictionaries):
            ctx = {"tenant": "default", "run_id": f"s{b}", "job_id": "j"}
            codes = np.arange(len(words), dtype=np.int32)[::-1].copy()
            cols: dict[str, Any] = {
                "step": np.full(len(words), b, dtype=np.int64),
                "rank": np.zeros(len(words), dtype=np.int32),
                "time": np.full(len(words), 1.7e9),
                "name": StringColumn(words, codes),
                "value": np.arange(len(words), dtype=np.float64) + 10 * b,
            }
            parts.append((ctx, cols, len(words), batch_key(ctx, f"b{b}", "scalar", "d")))
            want += [(f"s{b}", words[c], float(10 * b + i)) for i, c in enumerate(codes)]
        store.insert_rows("scalar", merged_table("scalar", parts))
        got = store.query(
            "SELECT run_id AS r, name AS n, value AS v FROM fleetlens.scalars"
        ).to_pylist()
        assert sorted((g["r"], g["n"], g["v"]) for g in got) == sorted(want)
    finally:
        store.close()


def test_ledger_settles_every_crash_window_against_the_engine(tmp_path: Path) -> None:
    store = ChdbStore(str(tmp_path / "t"))
    path = str(tmp_path / "t" / "ingest.ledger")
    try:
        ledger = Ledger(path, store.settle)
        stored, never, partial = _piece("r", "a", 10), _piece("r", "b", 10), _piece("r", "c", 10)
        # Crash after the table got the rows and before its views did (the engine writes
        # them one after the other): stored whole, and the views get them from the table.
        ledger.intend([("step", stored[1][3], 10)])
        store.insert_rows("step", merged_table("step", [stored[1]]))
        for view in ("steps_by_step", "rollup_steps_10s", "rollup_steps_1m"):
            store.command(f"ALTER TABLE fleetlens.{view} DELETE WHERE run_id = 'r' "
                          "SETTINGS mutations_sync = 1")  # fmt: skip
        assert _in_views(store, "r") == [0, 0, 0]
        ledger.close()
        ledger = Ledger(path, store.settle)
        assert ledger.recovered == 1 and ledger.stored(stored[1][3])
        assert _in_views(store, "r") == [10, 10, 10]
        # Crash before the insert ran: not stored, its retry must be stored.
        ledger.intend([("step", never[1][3], 10)])
        ledger.close()
        ledger = Ledger(path, store.settle)
        assert ledger.recovered == 0 and not ledger.stored(never[1][3])
        assert ledger.stored(stored[1][3])  # what was settled before is still known
        # Crash with part of an insert stored: the part is deleted, the retry stores it whole.
        ledger.intend([("step", partial[1][3], 10)])
        ctx, cols, _, key = partial[1]
        store.insert_rows("step", merged_table("step", [(ctx, slice_columns(cols, 0, 4), 4, key)]))
        ledger.close()
        ledger = Ledger(path, store.settle)
        assert not ledger.stored(partial[1][3]) and _count(store, "r") == 10
        assert _in_views(store, "r") == [10, 10, 10]  # the views forgot the part, too
        # The retries through group commit: the stored one dropped, the others stored once.
        committer = GroupCommitter(store, ledger)
        committer.submit([stored, never, partial]).result(30)
        committer.close()
        assert _count(store, "r") == 30 and _in_views(store, "r") == [30, 30, 30]
        assert committer.stats.retried_pieces == 1
    finally:
        store.close()


def test_requests_that_keep_coming_linger_into_one_insert_and_a_lone_one_waits_only_the_gap(
    tmp_path: Path,
) -> None:
    """The engine's cost is per insert (issue 35): requests arriving back to back are held
    (up to ``linger_s``) into one insert, while one that nothing follows is inserted once the
    ``gap_s`` passed, long before the linger."""
    store = ChdbStore(str(tmp_path / "t"))
    committer = GroupCommitter(
        store, Ledger(str(tmp_path / "t" / "ingest.ledger"), store.settle), linger_s=30, gap_s=3
    )
    try:
        t0 = time.monotonic()
        committer.submit([_piece("lone", "a", 10)]).result(20)
        assert time.monotonic() - t0 < 20 and committer.stats.inserts == 1
        pieces = [[_piece("many", f"b{i}", 10)] for i in range(40)]  # built first: back to back
        futures = [committer.submit(p) for p in pieces]
        for f in futures:
            f.result(60)
        assert committer.stats.inserts == 2 and committer.stats.largest_group == 40
        assert _count(store, "many") == 400 and _count(store, "lone") == 10
    finally:
        committer.close()
        store.close()


def test_sigkill_under_concurrent_senders_loses_no_ack_and_stores_none_twice(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "d")
    server = Server(data).start()
    port = server.port
    senders, per_sender, ranks = 12, 40, 16
    bodies = {
        (s, i): step_batch(f"kill-{s}", range(i, i + 1), ranks, batch_id=f"k-{s}-{i}",
                           t0=1.7e9 + i)[1]
        for s in range(senders)
        for i in range(per_sender)
    }  # fmt: skip
    acked: set[tuple[int, int]] = set()
    lock = threading.Lock()

    def sender(s: int) -> None:
        for i in range(per_sender):
            try:
                status, _, _ = server.post(bodies[(s, i)])
            except (OSError, http.client.HTTPException):  # killed mid-answer: IncompleteRead
                return
            if status == 200:
                with lock:
                    acked.add((s, i))

    threads = [threading.Thread(target=sender, args=(s,)) for s in range(senders)]
    for t in threads:
        t.start()
    while len(acked) < senders * per_sender // 3:
        time.sleep(0.005)
    server.kill()
    for t in threads:
        t.join()
    assert len(acked) < senders * per_sender
    server = Server(data, port=port).start()
    try:
        for s in range(senders):  # every acknowledged batch survived
            steps = server.get(f"/v1/runs/kill-{s}/ranks?fromStep=0&toStep={per_sender}")
            have = {r["steps"] for r in steps["ranks"]} or {0}
            assert min(have) >= sum(1 for (x, _) in acked if x == s)
        # Every batch is retried (the acknowledged ones too): each stored exactly once.
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            codes = list(pool.map(server.post, bodies.values()))
        assert {c[0] for c in codes} == {200}
        for s in range(senders):
            ranks_seen = server.get(f"/v1/runs/kill-{s}/ranks?fromStep=0&toStep={per_sender}")
            assert {r["steps"] for r in ranks_seen["ranks"]} == {per_sender}, s
            run = server.get(f"/v1/runs/kill-{s}")
            assert run["tokensProcessed"] == per_sender * ranks * 1000
    finally:
        server.stop()


def test_pacing_spreads_the_senders_to_the_rate_the_server_holds() -> None:
    pacer = Pacer(max_request_rate=100)
    # 400 senders flushing every second, then the same 400 every 4 s: 400 senders both times.
    for sec in range(5):
        for _ in range(400):
            pacer.observe(1.0, now=1000 + sec + 0.5)
    assert pacer.senders(now=1005.1) == pytest.approx(400)
    assert pacer.advise(now=1005.1) == pytest.approx(4.0)  # 400 senders / 100 per second
    for sec in range(5, 10):
        for _ in range(100):
            pacer.observe(4.0, now=1000 + sec + 0.5)
    assert pacer.advise(now=1010.1) == pytest.approx(4.0)  # converged: it stays there
    # Half of them finish: the interval halves, the floor is the sender's own.
    for sec in range(10, 15):
        for _ in range(50):
            pacer.observe(4.0, now=1000 + sec + 0.5)
    assert pacer.advise(now=1015.1) == pytest.approx(2.0)
    assert pacer.advise(backlog=0.9, now=1015.1) > 2.0  # a full queue stretches it
    assert Pacer(100).advise(now=5.0) == 0.0  # no load: the senders' own intervals


def test_the_server_paces_real_sdk_runs(tmp_path: Path) -> None:
    import fleetlens

    server = Server(str(tmp_path / "d"), env={"FLEETLENS_MAX_REQUEST_RATE": "5"}).start()
    try:
        runs = [
            fleetlens.init(
                project="p",
                run_id=f"paced-{r}",
                server=server.url,
                rank=r,
                world_size=8,
                flush_interval=0.2,
                exit_flush_timeout=60.0,  # finish() sends everything, however slow the server
                spool_dir=str(tmp_path / f"s{r}"),
            )
            for r in range(8)
        ]
        # 8 ranks flushing every 0.2 s would be 40 requests/s against a server holding 5: they
        # settle towards 8 / 5 = 1.6 s (each states how often it really sends, so a server slowed
        # by a busy machine still counts 8). Training goes on until they have, at least 8 s.
        deadline = time.monotonic() + 90
        step = 0
        while True:
            for run in runs:
                with run.step(step):
                    pass
                run.log(step, loss=1.0, lr=0.1, **{f"m{run.config.rank}": 2.0})
            step += 1
            intervals = [run._exporter.interval for run in runs]  # type: ignore[attr-defined]
            if step >= 80 and (min(intervals) > 0.8 or time.monotonic() > deadline):
                break
            time.sleep(0.1)
        for run in runs:
            run.finish()
        # The ranks' batches share inserts, their names in one dictionary: none was refused.
        assert [run.stats()["send_failures"] for run in runs] == [0] * 8
        assert min(intervals) > 0.8, intervals
        wait_until(lambda: server.get("/v1/runs/paced-0")["steps"] == step, 60, 0.2, "all steps")
        assert server.get("/v1/runs/paced-7")["metrics"]["m7"] == 2.0
    finally:
        server.stop()


def test_a_token_revoked_from_another_process_stops_working_within_a_second(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "d")
    env = {**os.environ}

    def cli(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "fleetlens", *args, "--data", data],
            check=True, capture_output=True, text=True, env=env,
        ).stdout  # fmt: skip

    token = cli("tokens", "create", "--tenant", "acme", "--role", "admin").split()[0]
    server = Server(data, extra_args=("--auth", "required")).start()
    try:
        body = step_batch("tok", range(0, 1), 2)[1]
        assert server.post(body, token=token)[0] == 200
        assert server.post(body, token=token)[0] == 200  # now from the cache
        cli("tokens", "revoke", "--tenant", "acme", "1")  # another process, the same database
        time.sleep(1.2)
        assert server.post(body, token=token)[0] == 401
    finally:
        server.stop()


def test_batches_sharing_strings_merge_into_one_insert(tmp_path: Path) -> None:
    # Every rank logs "loss" and names the same node: the merged dictionary holds each word
    # once (the engine refuses an insert whose dictionary repeats a word).
    store = ChdbStore(str(tmp_path / "t"))
    try:
        parts: list[Part] = []
        for rank in range(3):
            ctx = {"tenant": "default", "run_id": "s", "job_id": "j"}
            cols: dict[str, Any] = {
                "step": np.arange(2, dtype=np.int64),
                "rank": np.full(2, rank, dtype=np.int32),
                "time": np.full(2, 1.7e9),
                "name": StringColumn(["loss", f"only-{rank}"], np.array([0, 1], np.int32)),
                "value": np.full(2, 0.5),
            }
            parts.append((ctx, cols, 2, batch_key(ctx, f"b{rank}", "scalar", "d")))
        merged = merged_table("scalar", parts)
        names = merged.column("name").combine_chunks()
        assert sorted(names.dictionary.to_pylist()) == ["loss", "only-0", "only-1", "only-2"]
        assert names.to_pylist() == [w for r in range(3) for w in ("loss", f"only-{r}")]
        store.insert_rows("scalar", merged)
        t = store.query("SELECT count() AS n FROM fleetlens.scalars WHERE name = 'loss'")
        assert int(t.column("n")[0].as_py()) == 3
    finally:
        store.close()
