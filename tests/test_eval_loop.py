"""The closed evaluation loop (issue 20 items 2-4): named suites, evaluations that start by
themselves, regressions that alert through the alert engine, latency and cost with their gates."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench._promstack import alertmanager, get_json
from fleetlens.alerts.engine import EvaluationSignals, evaluate_evaluation, fingerprint
from fleetlens.alerts.policy import DEFAULT_POLICY
from fleetlens.evaluation.gates import evaluate_gate, parse_policies
from fleetlens.evaluation.performance import performance, price_for
from fleetlens.evaluation.regressions import find_regressions
from fleetlens.evaluation.requests import TriggerRequest
from fleetlens.testing import Server, step_batch, wait_passes, wait_until
from fleetlens.wire import TableBuilder, encode_batch

from .test_eval_support import start_worker, wait_for

pytestmark = pytest.mark.e2e

# -- models and a classifier, imported by the worker processes by name ------------------------


def safe_model(prompt: str, *, n: int, decoding: Any, example_id: str) -> list[str]:
    return [f"answer {example_id}"] * n


def unsafe_model(prompt: str, *, n: int, decoding: Any, example_id: str) -> list[str]:
    """As right as the safe model on the questions, and harmful on every safety prompt."""
    return [f"answer {example_id}" + (" UNSAFE" if prompt.startswith("s") else "")] * n


def slow_model(prompt: str, *, n: int, decoding: Any, example_id: str) -> list[str]:
    time.sleep(0.03)
    return [f"answer {example_id}"] * n


def is_unsafe(prompt: str, response: str) -> bool:
    return "UNSAFE" in response


def _examples(n: int, prefix: str = "q") -> list[dict[str, Any]]:
    return [{"id": str(i), "prompt": f"{prefix}{i}", "answer": f"answer {i}"} for i in range(n)]


def _suite(name: str, version: str = "1", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "version": version,
        "benchmarks": [
            {"name": "qa", "version": "1", "source": "inline", "examples": _examples(20),
             "metrics": ["exact_match"]},
            {"name": "safety", "version": "1", "source": "inline", "examples": _examples(20, "s"),
             "metrics": ["safety"], "classifier": "tests.test_eval_loop:is_unsafe"},
        ],
        **extra,
    }  # fmt: skip


def _adapter(name: str) -> dict[str, str]:
    return {"kind": "callable", "target": f"tests.test_eval_loop:{name}"}


@pytest.fixture
def evalserver(tmp_path: Path) -> Iterator[Server]:
    srv = Server(str(tmp_path / "data"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "3600"}).start()
    try:
        yield srv
    finally:
        srv.stop()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def _run_with_checkpoints(srv: Server, run_id: str, steps: tuple[int, ...]) -> None:
    _, body = step_batch(run_id, range(0, max(steps) + 1), 2)
    assert srv.post(body)[0] == 200
    for step in steps:
        st, ck = srv.request(
            "POST", f"/v1/runs/{run_id}/checkpoints",
            {"step": step, "uri": f"/ck/{run_id}/{step}", "checksum": f"sha256:{run_id}{step}"},
        )  # fmt: skip
        assert st == 200, ck


def _fleetlens(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlens", *args], capture_output=True, text=True, timeout=120
    )


# -- suites, by name, and triggers ---------------------------------------------------------


def test_a_registered_suite_is_named_in_a_request_and_a_checkpoint_triggers_it(
    evalserver: Server, tmp_path: Path
) -> None:
    srv = evalserver
    # Registered once from a YAML file through the CLI; the same version again is a no-op,
    # other content under the same version is refused.
    suite_file = tmp_path / "suite.yaml"
    import yaml

    suite_file.write_text(yaml.safe_dump(_suite("preproduction", "12")))
    reg = _fleetlens("eval", "suites", "register", str(suite_file), "--server", srv.url)
    assert reg.returncode == 0, reg.stderr
    again = _fleetlens("eval", "suites", "register", str(suite_file), "--server", srv.url)
    assert again.returncode == 0 and '"created": false' in again.stdout, again.stderr
    other = _suite("preproduction", "12", decoding={"temperature": 0.5})
    st, err = srv.request("POST", "/v1/evaluation-suites", other)
    assert st == 409 and "immutable" in err["detail"]
    listed = _fleetlens("eval", "suites", "list", "--server", srv.url)
    assert "preproduction@12  benchmarks qa,safety" in listed.stdout, listed.stderr
    assert srv.get("/v1/evaluation-suites/preproduction")["version"] == "12"

    # POST /v1/evaluations by name, as seed 001 s43 writes it.
    st, err = srv.request(
        "POST", "/v1/evaluations", {"benchmarkSuite": "nope", "adapter": _adapter("safe_model")}
    )
    assert st == 404 and "benchmarkSuite 'nope'" in err["detail"]
    st, err = srv.request(
        "POST", "/v1/evaluations",
        {"benchmarkSuite": "preproduction", "suite": _suite("x"),
         "adapter": _adapter("safe_model")},
    )  # fmt: skip
    assert st == 400 and "benchmarkSuite" in err["detail"]
    st, err = srv.request("POST", "/v1/evaluations", {"benchmarkSuite": "preproduction"})
    assert st == 400 and "adapter is missing" in err["detail"]
    st, by_name = srv.request(
        "POST", "/v1/evaluations",
        {"benchmarkSuite": "preproduction@12", "adapter": _adapter("safe_model")},
    )  # fmt: skip
    assert st == 202, by_name

    # A policy: in project "test", a verified checkpoint is evaluated on the suite.
    adapter = json.dumps({**_adapter("safe_model"), "note": "{checkpointUri}"})
    added = _fleetlens(
        "eval", "triggers", "add", "--on", "checkpoint", "--project", "test",
        "--suite", "preproduction", "--adapter", adapter, "--server", srv.url,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    trig = json.loads(added.stdout)
    st, _ = srv.request(
        "POST", "/v1/evaluation-triggers",
        {"on": "checkpoint", "project": "elsewhere", "suite": "preproduction",
         "adapter": _adapter("safe_model")},
    )  # fmt: skip
    assert st == 201
    _, body = step_batch("trig-run", range(0, 10), 2)
    assert srv.post(body)[0] == 200
    st, unverified = srv.request("POST", "/v1/runs/trig-run/checkpoints", {"step": 4})
    assert st == 200 and "triggered" not in unverified  # no checksum: not verified
    st, ck = srv.request(
        "POST", "/v1/runs/trig-run/checkpoints",
        {"step": 9, "uri": "/ck/trig-run/9", "checksum": "sha256:abc"},
    )  # fmt: skip
    assert st == 200 and ck["triggered"]["errors"] == []
    (eid,) = ck["triggered"]["evaluations"]  # the other project's trigger did not fire
    st, again = srv.request(
        "POST", "/v1/runs/trig-run/checkpoints",
        {"step": 9, "uri": "/ck/trig-run/9", "checksum": "sha256:abc"},
    )  # fmt: skip
    assert again["triggered"]["evaluations"] == []  # once per checkpoint

    worker = start_worker(srv, "--idle-exit", "3")
    try:
        done = wait_for(srv, eid, 120)
        named = wait_for(srv, by_name["evaluationId"], 120)
    finally:
        _stop(worker)
    assert done["state"] == "COMPLETED", done["error"]
    assert (done["runId"], done["checkpointId"]) == ("trig-run", "trig-run@9")
    assert done["triggerId"] == trig["triggerId"]
    assert done["suite"] == {"name": "preproduction", "version": "12"}
    assert done["provenance"]["modelHash"] == "sha256:abc"  # the checkpoint's own hash
    assert done["provenance"]["adapter"]["note"] == "/ck/trig-run/9"  # the template, filled
    assert done["metrics"]["qa"]["exact_match"]["mean"] == 1.0
    assert named["state"] == "COMPLETED" and named["metrics"]["safety"]["unsafe_rate"]["n"] == 20


def test_a_checkpoint_the_sdk_verified_triggers_its_suite(evalserver: Server) -> None:
    """``fleetlens.torch`` reports a verified checkpoint as a ``checkpoint_end`` event with its
    ``sha256``: ingesting it starts the evaluation, whose provenance carries that hash."""
    srv = evalserver
    assert srv.request("POST", "/v1/evaluation-suites", _suite("nightly"))[0] == 201
    st, _ = srv.request(
        "POST", "/v1/evaluation-triggers",
        {"on": "checkpoint", "suite": "nightly", "adapter": _adapter("safe_model")},
    )  # fmt: skip
    assert st == 201
    _, steps = step_batch("sdk-run", range(0, 10), 2)
    assert srv.post(steps)[0] == 200
    ev = TableBuilder("event")
    ev.add("time", [time.time()]).add("kind", ["checkpoint_end"]).add("step", [9])
    ev.add("attrs", [json.dumps({"step": 9, "path": "/ck/sdk-run/9", "sha256": "beef",
                                 "verified": True, "size_bytes": 10})])  # fmt: skip
    ctx = {"run_id": "sdk-run", "job_id": "j1", "project": "test"}
    assert srv.post(encode_batch({"event": ev.build()}, ctx)[1])[0] == 200
    (queued,) = srv.get("/v1/evaluations")["evaluations"]
    assert (queued["runId"], queued["checkpointId"]) == ("sdk-run", "sdk-run@9")
    assert queued["provenance"]["modelHash"] == "sha256:beef"  # the checkpoint's, not the spec's


def test_registering_a_model_version_starts_its_evaluation(evalserver: Server) -> None:
    srv = evalserver
    assert srv.request("POST", "/v1/evaluation-suites", _suite("release"))[0] == 201
    st, err = srv.request("POST", "/v1/evaluation-triggers", {"on": "model", "suite": "missing"})
    assert st == 404 and "missing" in err["detail"]
    st, err = srv.request(
        "POST", "/v1/evaluation-triggers", {"on": "deploy", "suite": "release"}
    )  # fmt: skip
    assert st == 400 and "'deploy'" in err["detail"]
    st, _ = srv.request(
        "POST", "/v1/evaluation-triggers",
        {"on": "model", "modelId": "llm", "suite": "release", "adapter": _adapter("safe_model"),
         "priority": "P1"},
    )  # fmt: skip
    assert st == 201
    _run_with_checkpoints(srv, "mv-run", (4,))
    st, mv = srv.request(
        "POST", "/v1/models", {"modelId": "llm", "version": "1", "runId": "mv-run", "step": 4}
    )
    assert st == 201, mv
    (eid,) = mv["triggered"]["evaluations"]
    st, other = srv.request(
        "POST", "/v1/models", {"modelId": "other", "version": "1", "runId": "mv-run", "step": 4}
    )
    assert other["triggered"]["evaluations"] == []  # the policy names model llm only
    ev = srv.get(f"/v1/evaluations/{eid}")
    assert (ev["modelId"], ev["modelVersion"], ev["priority"]) == ("llm", "1", "P1")
    # on an alias: moving "candidate" to a version evaluates it (the same suite, a new policy)
    st, _ = srv.request(
        "POST", "/v1/evaluation-triggers",
        {"on": "alias", "modelId": "other", "alias": "candidate", "suite": "release",
         "adapter": _adapter("safe_model")},
    )  # fmt: skip
    assert st == 201
    st, moved = srv.request("POST", "/v1/models/other/aliases/candidate", {"version": "1"})
    assert st == 200 and len(moved["triggered"]["evaluations"]) == 1, moved
    st, moved = srv.request("POST", "/v1/models/other/aliases/staging", {"version": "1"})
    assert moved["triggered"]["evaluations"] == []


# -- latency and cost --------------------------------------------------------------------------


def test_latency_and_cost_are_measured_per_example_and_gated(evalserver: Server) -> None:
    srv = evalserver
    prices = {"tests.test_eval_loop:slow_model": {"inputPer1kTokens": 1.0,
                                                   "outputPer1kTokens": 2.0}}  # fmt: skip
    suite = _suite("priced", prices=prices)
    assert srv.request("POST", "/v1/evaluation-suites", suite)[0] == 201
    _run_with_checkpoints(srv, "perf-run", (4,))
    st, _ = srv.request(
        "POST", "/v1/models", {"modelId": "fast", "version": "1", "runId": "perf-run", "step": 4}
    )
    # as seed 001 s43 writes the request: the version and checkpoint, no model id
    st, ev = srv.request(
        "POST", "/v1/evaluations",
        {"modelVersion": "1", "checkpointId": "perf-run@4", "benchmarkSuite": "priced",
         "adapter": _adapter("slow_model")},
    )  # fmt: skip
    assert st == 202 and ev["modelId"] == "fast", ev
    st, err = srv.request(
        "POST", "/v1/evaluations",
        {"modelVersion": "1", "checkpointId": "perf-run@0", "benchmarkSuite": "priced",
         "adapter": _adapter("slow_model")},
    )  # fmt: skip
    assert st == 400 and "checkpointId 'perf-run@0'" in err["detail"]
    worker = start_worker(srv, "--idle-exit", "3")
    try:
        done = wait_for(srv, ev["evaluationId"], 120)
    finally:
        _stop(worker)
    perf = done["metrics"]["performance"]
    assert perf["latency_p50_ms"]["n"] == 40 and perf["latency_p50_ms"]["mean"] >= 30.0
    assert perf["latency_p95_ms"]["mean"] >= perf["latency_p50_ms"]["mean"]
    # prompt "qN": 1 word in; "answer N": 2 words out -> 1/1000*1 + 2/1000*2 = 0.005 an example
    assert perf["tokens_in_mean"]["mean"] == 1.0 and perf["tokens_out_mean"]["mean"] == 2.0
    assert perf["cost_per_1k_examples"]["mean"] == pytest.approx(5.0)
    rows = srv.get(f"/v1/evaluations/{ev['evaluationId']}/examples")["examples"]
    assert {r["metric"] for r in rows} >= {"latency_ms", "tokens_in", "tokens_out"}
    assert "latency_ms" not in done["metrics"]["qa"]  # usage is not a benchmark score

    def gate(policies: list[dict[str, Any]]) -> dict[str, Any]:
        st, out = srv.request(
            "POST", "/v1/gates", {"modelId": "fast", "version": "1", "policies": policies}
        )
        assert st == 201, out
        return dict(out)

    assert gate([{"metric": "latency_p95_ms", "max": 60_000},
                 {"metric": "cost_per_1k_examples", "max": 6.0}])["passed"]  # fmt: skip
    slow = gate([{"metric": "latency_p95_ms", "max": 1.0}])
    assert not slow["passed"] and slow["failed"] == ["performance/latency_p95_ms"]
    dear = gate([{"metric": "cost_per_1k_examples", "max": 4.0}])
    assert not dear["passed"] and "above the maximum 4.0" in dear["checks"][0]["reasons"][0]
    st, err = srv.request(
        "POST", "/v1/gates",
        {"modelId": "fast", "version": "1", "policies": [{"metric": "performance/speed"}]},
    )  # fmt: skip
    assert st == 400 and "performance/speed" in err["detail"]


def test_performance_figures_and_their_gates() -> None:
    rows = [{"latency_ms": float(ms), "tokens_in": 10.0, "tokens_out": 5.0} for ms in range(1, 101)]
    table = {"gpt": {"inputPer1kTokens": 0.5, "outputPer1kTokens": 1.5}}
    price = price_for(table, {"model": "gpt"})
    perf = performance(rows, price)
    assert perf["latency_p50_ms"]["mean"] == pytest.approx(50.5)
    assert perf["latency_p95_ms"]["mean"] == pytest.approx(95.05)
    assert perf["cost_per_1k_examples"]["mean"] == pytest.approx(12.5)  # 5e-3 + 7.5e-3 each
    assert price_for({"gpt": {}}, {"model": "other"}) is None
    assert "cost_per_example" not in performance(rows, None)  # no price, no cost
    policies = parse_policies([{"metric": "latency_p95_ms", "max": 90.0}])
    assert not evaluate_gate(policies, {}, None, perf).passed
    policies = parse_policies([{"metric": "latency_p95_ms", "max": 100.0}])
    assert evaluate_gate(policies, {}, None, perf).passed
    # against a baseline: p95 worse by more than the allowance (in ms) is a regression
    faster = {**perf, "latency_p95_ms": {"mean": 80.0, "stderr": 0.0, "n": 100}}
    policies = parse_policies([{"metric": "latency_p95_ms", "maxRegression": 10.0}])
    assert not evaluate_gate(policies, {}, {}, perf, faster).passed
    assert evaluate_gate(policies, {}, {}, faster, perf).passed


# -- regressions alert ------------------------------------------------------------------------


def test_regressions_have_kinds_and_the_policy_pages_only_on_safety() -> None:
    cand = {"safety": {str(i): {"unsafe_rate": 1.0} for i in range(20)},
            "qa": {str(i): {"exact_match": 0.0} for i in range(20)}}  # fmt: skip
    base = {"safety": {str(i): {"unsafe_rate": 0.0} for i in range(20)},
            "qa": {str(i): {"exact_match": 1.0} for i in range(20)}}  # fmt: skip
    m = {"safety": {"unsafe_rate": {"mean": 1.0}}, "qa": {"exact_match": {"mean": 0.0}},
         "performance": {"latency_p95_ms": {"mean": 300.0}}}  # fmt: skip
    bm = {"safety": {"unsafe_rate": {"mean": 0.0}}, "qa": {"exact_match": {"mean": 1.0}},
          "performance": {"latency_p95_ms": {"mean": 100.0}}}  # fmt: skip
    found = find_regressions(None, cand, m, base, bm)
    assert found is not None
    assert {(r.kind, r.metric) for r in found} == {
        ("safety", "safety/unsafe_rate"), ("benchmark", "qa/exact_match"),
        ("latency", "performance/latency_p95_ms"),
    }  # fmt: skip
    assert find_regressions(None, cand, m, None, None) is None  # nothing to judge by
    sig = EvaluationSignals("acme", "llm", "r1", "m", "2", "ev-1", 1.0,
                            [{**r.as_json(), "baselineVersion": "1"} for r in found])  # fmt: skip
    cands = {c.rule.name: c for c in evaluate_evaluation(DEFAULT_POLICY, sig)}
    assert {n: c.labels["severity"] for n, c in cands.items()} == {
        "EvalSafetyRegression": "page", "EvalBenchmarkRegression": "ticket",
        "EvalLatencyRegression": "ticket",
    }  # fmt: skip
    page = cands["EvalSafetyRegression"]
    assert page.labels["model_version"] == "2" and page.labels["baseline_version"] == "1"
    # a run's alert keeps its fingerprint; two versions of one run's model do not share one
    run_labels = {"tenant": "acme", "alertname": "JobHang", "run_id": "r1"}
    assert fingerprint(run_labels) == fingerprint({**run_labels, "model_id": ""})
    other = EvaluationSignals("acme", "llm", "r1", "m", "3", "ev-2", 1.0, sig.regressions)
    assert evaluate_evaluation(DEFAULT_POLICY, other)[0].fingerprint != page.fingerprint


def test_a_safety_regression_pages_through_alertmanager_and_shows_in_compare(
    tmp_path: Path,
) -> None:
    gates = [
        {"metric": "safety/unsafe_rate", "direction": "lower", "max": 0.02, "kind": "safety"},
        {"metric": "qa/exact_match", "test": "mcnemar", "maxRegression": 0.05},
    ]
    with alertmanager() as am:
        srv = Server(
            str(tmp_path / "data"),
            env={"FLEETLENS_ALERTMANAGER_URL": am, "FLEETLENS_ANALYSIS_INTERVAL_S": "0.5"},
        ).start()
        worker = None
        try:
            suite = _suite("rel", gates=gates)
            assert srv.request("POST", "/v1/evaluation-suites", suite)[0] == 201
            _run_with_checkpoints(srv, "v1-run", (4,))
            _run_with_checkpoints(srv, "v2-run", (4,))
            for version, run in (("1", "v1-run"), ("2", "v2-run")):
                st, _ = srv.request(
                    "POST", "/v1/models",
                    {"modelId": "llm", "version": version, "runId": run, "step": 4},
                )  # fmt: skip
                assert st == 201
            worker = start_worker(srv, "--idle-exit", "600")
            st, base = srv.request(
                "POST", "/v1/evaluations",
                {"benchmarkSuite": "rel", "adapter": _adapter("safe_model"), "modelId": "llm",
                 "modelVersion": "1"},
            )  # fmt: skip
            base = wait_for(srv, base["evaluationId"], 120)
            assert base["state"] == "COMPLETED" and base["regressions"] == []  # within bounds
            for alias in ("canary", "production"):
                st, out = srv.request(
                    "POST", f"/v1/models/llm/aliases/{alias}",
                    {"version": "1", "overrideReason": "first model"},
                )  # fmt: skip
                assert st == 200, out
            st, cand = srv.request(
                "POST", "/v1/evaluations",
                {"benchmarkSuite": "rel", "adapter": _adapter("unsafe_model"), "modelId": "llm",
                 "modelVersion": "2"},
            )  # fmt: skip
            cand = wait_for(srv, cand["evaluationId"], 120)
            assert [r["kind"] for r in cand["regressions"]] == ["safety"]
            assert cand["regressions"][0]["baselineEvaluation"] == base["evaluationId"]

            def paged() -> list[dict[str, Any]]:
                return [
                    a for a in get_json(am + "/api/v2/alerts")
                    if a["labels"].get("alertname", "").startswith("Eval")
                ]  # fmt: skip

            (alert,) = wait_until(paged, 60, 0.25, "the regression reaching Alertmanager")
            labels = alert["labels"]
            assert (labels["alertname"], labels["severity"], labels["audience"]) == (
                "EvalSafetyRegression", "page", "ml_platform",
            )  # fmt: skip
            assert (labels["model_id"], labels["model_version"], labels["run_id"]) == (
                "llm", "2", "v2-run",
            )  # fmt: skip
            assert labels["evaluation_id"] == cand["evaluationId"]
            assert labels["baseline_version"] == "1" and labels["metric"] == "safety/unsafe_rate"
            wait_passes(srv, 3)  # later passes neither resolve it nor raise it again
            assert len(paged()) == 1
            mine = srv.get("/v1/alerts?state=firing")["alerts"]
            assert [a["alertname"] for a in mine if a["alertname"].startswith("Eval")] == [
                "EvalSafetyRegression"
            ]

            # the same request again is answered from the cache, and judged all the same
            st, hit = srv.request(
                "POST", "/v1/evaluations",
                {"benchmarkSuite": "rel", "adapter": _adapter("unsafe_model"), "modelId": "llm",
                 "modelVersion": "2"},
            )  # fmt: skip
            assert hit["cacheHit"] and [r["kind"] for r in hit["regressions"]] == ["safety"]

            # fleetlens compare: the evaluation difference between the two models' runs
            compared = srv.get("/v1/runs/compare?runs=v1-run,v2-run")
            cmp = compared["evaluations"]
            assert cmp["metrics"]["safety/unsafe_rate"] == {"values": [0.0, 1.0],
                                                            "deltas": [0.0, 1.0]}  # fmt: skip
            # ...and the conclusion weighs it: a safety regression is a regression.
            (concl,) = compared["conclusions"]
            assert concl["evaluationRegressed"] and concl["cause"] != "none", concl
            assert any(
                "Evaluation of v2-run failed: safety regression in safety/unsafe_rate" in line
                for line in concl["lines"]
            ), concl["lines"]
            out = _fleetlens("compare", "v1-run", "v2-run", "--server", srv.url)
            assert out.returncode == 0, out.stderr
            assert "Evaluation of v2-run failed" in out.stdout
            assert any(
                line.startswith("safety/unsafe_rate") and "(+1)" in line
                for line in out.stdout.splitlines()
            ), out.stdout
        finally:
            if worker is not None:
                _stop(worker)
            srv.stop()


def test_triggers_regressions_and_their_alerts_on_both_engines(metadata_url: str) -> None:
    """The metadata half on SQLite and PostgreSQL: a trigger fires once per version, a candidate
    is judged against production, and the monitor's evaluation pass raises the page, which the
    run pass (reconciling the same run's alerts) leaves alone."""
    from fleetlens.alerts.notifiers import Delivery
    from fleetlens.alerts.store import AlertStore
    from fleetlens.evaluation.registry import Registry
    from fleetlens.evaluation.rows import EvaluationView
    from fleetlens.evaluation.store import EvalStore
    from fleetlens.services.monitor import Monitor
    from fleetlens.store.access import AccessStore
    from fleetlens.store.metadata import MetadataStore

    from .test_eval_store import A, _model

    meta = MetadataStore(metadata_url)
    delivery = Delivery([])
    try:
        evals = EvalStore(meta)
        reg = Registry(meta, evals, AccessStore(meta))
        evals.suites.register(A, _suite("rel"))
        evals.suites.add_trigger(A, TriggerRequest(on="model", suite="rel", adapter=_adapter("x")))

        def evaluate(version: str, unsafe: float) -> EvaluationView:
            _model(meta, version)
            fired = evals.fire("acme", "", "model", model_id="llm", version=version,
                               run_id="run-1", checkpoint_id=f"ck{version}")  # fmt: skip
            (eid,) = fired["evaluations"]
            again = evals.fire("acme", "", "model", model_id="llm", version=version,
                               run_id="run-1", checkpoint_id=f"ck{version}")  # fmt: skip
            assert again == {"evaluations": [], "errors": []}
            while (sh := evals.lease(A, "w")) is not None:
                key = "exact_match" if sh.benchmark.name == "qa" else "unsafe_rate"
                value = 1.0 if key == "exact_match" else unsafe
                scores = {e["id"]: {key: value, "latency_ms": 5.0} for e in sh.examples}
                evals.complete(A, sh.shard_id, sh.lease_token, scores)  # type: ignore[arg-type]
            return evals.get(A, eid)

        first = evaluate("1", 0.0)
        assert first.regressions is None  # no production yet, no gates: nothing to judge by
        assert first.metrics["performance"]["latency_p95_ms"]["mean"] == 5.0
        for alias in ("canary", "production"):
            reg.set_alias(A, "llm", alias, "1", override_reason="first")
        second = evaluate("2", 1.0)
        assert [(r["kind"], r["metric"]) for r in second.regressions or []] == [
            ("safety", "safety/unsafe_rate")
        ]
        alerts = AlertStore(meta, AccessStore(meta))
        monitor = Monitor(None, meta, None, alerts, delivery, None, DEFAULT_POLICY)  # type: ignore[arg-type]
        names = monitor._evaluation_rules()
        monitor._evaluation_alerts(time.time(), names)
        (page,) = alerts.list(A, state="firing")
        assert (page.alertname, page.labels["model_version"]) == ("EvalSafetyRegression", "2")
        alerts.apply("acme", ["run-1"], [], time.time(), exclude=names)  # the run pass
        assert [a.alertname for a in alerts.list(A, state="firing")] == ["EvalSafetyRegression"]
    finally:
        delivery.close()
        meta.engine.dispose()
