"""The collector and run API end to end: a real server process, real HTTP, the real engines."""

from __future__ import annotations

import concurrent.futures
import gzip
import http.client
import json
import threading
import time

import msgspec
import pytest

from fleetlens.api.ops_models import IngestAckOut
from fleetlens.testing import Server, step_batch
from fleetlens.wire import TableBuilder, encode_batch

pytestmark = pytest.mark.e2e


def _count_steps(server: Server, run_id: str) -> int:
    try:
        return int(server.get(f"/v1/runs/{run_id}")["steps"])
    except Exception:
        return 0


def _run_batches(run_id: str, t0: float) -> list[bytes]:
    ctx = {"run_id": run_id, "job_id": f"{run_id}-a0", "project": "llm"}
    placement = TableBuilder("placement")
    placement.add("time", [t0] * 4).add("rank", [0, 1, 2, 3]).add("world_size", [4] * 4)
    placement.add("node_id", ["node-1", "node-1", "node-2", "node-2"]).add("gpu", [0, 1, 0, 1])
    placement.add("rack", ["r1", "r1", "r2", "r2"])
    events = TableBuilder("event")
    events.add("time", [t0, t0 + 10.5, t0 + 20])
    events.add("kind", ["job_start", "config_change", "finish"])
    events.add("step", [-1, 20, -1])
    events.add("message", ["", "lr 3e-4 -> 6e-4", ""])
    events.add("attrs", [json.dumps({"config": {"lr": 3e-4, "layers": 12}}), "{}", "{}"])
    scalars = TableBuilder("scalar")
    steps = list(range(40))
    lr = [3e-4 if s < 20 else 6e-4 for s in steps]
    loss = [2.0 - 0.01 * s for s in steps]
    loss[35] = float("nan")
    scalars.add("step", steps * 2).add("time", [t0 + 0.5 * s for s in steps] * 2)
    scalars.add("name", ["lr"] * 40 + ["loss"] * 40).add("value", lr + loss)
    _, first = encode_batch(
        {"placement": placement.build(), "event": events.build(), "scalar": scalars.build()},
        ctx,
        compress=True,
    )
    _, steps_body = step_batch(
        run_id, range(0, 40), 4, job_id=f"{run_id}-a0", t0=t0, slow={2: 1.15}
    )
    return [first, steps_body]


def test_ingest_then_read_the_run_back(server: Server) -> None:
    t0 = time.time() - 30
    bodies = _run_batches("run-a", t0)
    status, ack, _ = server.post(bodies[0], encoding="gzip")
    assert status == 200 and ack["status"] == "stored" and ack["rows"]["placement"] == 4
    IngestAckOut.model_validate(ack)  # the fast path's answer is the documented one
    assert server.post(bodies[1])[0] == 200

    runs = server.get("/v1/runs")["runs"]
    assert [r["runId"] for r in runs] == ["run-a"]
    run = server.get("/v1/runs/run-a")
    assert run["status"] == "FINISHED"
    assert run["step"] == 39 and run["tokensProcessed"] == 40 * 4 * 1000
    assert run["config"] == {"lr": 3e-4, "layers": 12}
    assert run["worldSize"] == 4 and run["project"] == "llm"
    assert abs(run["metrics"]["stepTimeMs"] - 460.0) < 1e-6  # the slowest rank sets the pace
    assert run["metrics"]["lr"] == 6e-4

    ranks = server.get("/v1/runs/run-a/ranks?sort=step_time&order=desc&limit=2")
    top = ranks["ranks"][0]
    assert (top["rank"], top["node"], top["gpu"], top["rack"]) == (2, "node-2", 0, "r2")
    assert abs(top["slowdown"] - 1.15) < 0.01
    assert len(ranks["ranks"]) == 2 and ranks["toStep"] == 39

    timeline = server.get("/v1/runs/run-a/timeline?fromStep=10&toStep=39")["items"]
    what = [(i["step"], i["source"], i["kind"]) for i in timeline]
    assert (20, "event", "config_change") in what
    assert (20, "metric", "changed") in what  # lr moved
    assert (35, "metric", "nonfinite") in what  # loss went NaN
    lr_change = next(i for i in timeline if i.get("metric") == "lr")
    assert lr_change["previous"] == 3e-4 and lr_change["value"] == 6e-4


def test_retried_batch_is_stored_once(server: Server) -> None:
    _, body = step_batch("run-b", range(0, 5), 3)
    for _ in range(3):
        assert server.post(body)[0] == 200
    assert server.get("/v1/runs/run-b")["tokensProcessed"] == 5 * 3 * 1000
    ranks = server.get("/v1/runs/run-b/ranks")["ranks"]
    assert all(r["steps"] == 5 for r in ranks)


def test_bad_batches_get_a_4xx_and_nothing_is_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = Server(str(tmp_path / "d"))
    server.extra_args = ()
    import os

    os.environ["FLEETLENS_MAX_BODY_BYTES"] = "200000"
    try:
        server.start()
    finally:
        del os.environ["FLEETLENS_MAX_BODY_BYTES"]
    try:
        _, good = step_batch("run-c", range(0, 3), 2)
        raw = msgspec.msgpack.decode(good)
        wrong_version = msgspec.msgpack.encode({**raw, "v": 7})
        bad_rank = json.dumps(
            {
                "v": 1,
                "batch_id": "x1",
                "ctx": {"run_id": "run-c"},
                "tables": {
                    "step": {
                        "n": 1,
                        "cols": {"step": [1], "rank": [-4], "time": [1.7e9], "duration": [0.1]},
                    }
                },
            }
        ).encode()
        _, big = step_batch("run-c", range(0, 3000), 8)
        cases = [
            (good[: len(good) // 2], "", 400, None),
            (b"\xc1garbage", "", 400, None),
            (wrong_version, "", 400, "v"),
            (bad_rank, "json", 400, "tables.step.cols.rank"),
            (gzip.compress(good)[:-10], "gzip", 400, None),
            (big, "", 413, None),
        ]
        for body, how, code, field in cases:
            status, err, _ = server.post(
                body,
                "application/json" if how == "json" else "application/msgpack",
                "gzip" if how == "gzip" else "",
            )
            assert status == code, (status, err)
            assert err["error"]
            if field:
                assert err["field"] == field
        assert server.get("/v1/runs")["runs"] == []  # nothing of any of them was written
        assert server.post(good)[0] == 200  # and the server keeps serving
        assert server.get("/v1/runs/run-c")["steps"] == 3
    finally:
        server.stop()


def test_full_queue_answers_429_with_retry_after(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    os.environ["FLEETLENS_MAX_INFLIGHT"] = "1"
    os.environ["FLEETLENS_QUEUE_WAIT_S"] = "0"
    try:
        server = Server(str(tmp_path / "d")).start()
    finally:
        del os.environ["FLEETLENS_MAX_INFLIGHT"]
        del os.environ["FLEETLENS_QUEUE_WAIT_S"]
    try:
        bodies = [step_batch(f"run-q{i}", range(0, 400), 1000)[1] for i in range(6)]
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            results = list(pool.map(server.post, bodies))
        codes = sorted(r[0] for r in results)
        assert 200 in codes and 429 in codes, codes
        throttled = next(r for r in results if r[0] == 429)
        assert throttled[2].get("retry-after") or throttled[2].get("Retry-After")
        stored = sum(1 for r in results if r[0] == 200)
        assert len(server.get("/v1/runs")["runs"]) == stored
    finally:
        server.stop()


def test_sigkill_mid_stream_loses_no_acknowledged_batch_and_stores_none_twice(
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    data = str(tmp_path / "d")
    server = Server(data).start()
    port = server.port
    n_batches, steps_per_batch, ranks = 60, 10, 256
    bodies = [
        step_batch(
            "run-k",
            range(i * steps_per_batch, (i + 1) * steps_per_batch),
            ranks,
            batch_id=f"kill-{i}",
            t0=1.7e9 + i * 10,
        )[1]
        for i in range(n_batches)
    ]
    acked: set[int] = set()

    def sender() -> None:
        for i, body in enumerate(bodies):
            try:
                status, _, _ = server.post(body)
            except (OSError, http.client.HTTPException):  # killed mid-answer: IncompleteRead
                continue
            if status == 200:
                acked.add(i)

    thread = threading.Thread(target=sender)
    thread.start()
    while len(acked) < 10:
        time.sleep(0.01)
    server.kill()
    thread.join()
    assert 10 <= len(acked) < n_batches
    server = Server(data, port=port).start()
    try:
        # Every acknowledged batch survived the kill.
        assert _count_steps(server, "run-k") >= len(acked) * steps_per_batch
        # The client retries everything it has no acknowledgement for (and, to be sure
        # nothing doubles, a few that were acknowledged too).
        for i, body in enumerate(bodies):
            if i not in acked or i % 7 == 0:
                assert server.post(body)[0] == 200
        run = server.get("/v1/runs/run-k")
        assert run["steps"] == n_batches * steps_per_batch
        assert run["tokensProcessed"] == n_batches * steps_per_batch * ranks * 1000
        ranks_seen = server.get(f"/v1/runs/run-k/ranks?fromStep=0&toStep={n_batches * 10}")
        assert {r["steps"] for r in ranks_seen["ranks"]} == {n_batches * steps_per_batch}
    finally:
        server.stop()


def test_openapi_lists_the_routes(server: Server) -> None:
    spec = server.get("/openapi.json")
    for path in (
        "/v1/ingest",
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/ranks",
        "/v1/runs/{run_id}/timeline",
    ):
        assert path in spec["paths"]


def test_unknown_run_is_404(server: Server) -> None:
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(server.url + "/v1/runs/nope", timeout=10)
        raise AssertionError("expected 404")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404
        assert "nope" in json.loads(exc.read())["error"]
