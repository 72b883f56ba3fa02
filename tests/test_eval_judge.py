"""LLM-as-a-judge: a versioned judge configuration, scores with rationale, in the cache key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bench._common import json_endpoint
from fleetlens.errors import ConfigError
from fleetlens.evaluation.adapters import Generation
from fleetlens.evaluation.benchmarks import aggregate, normalize_spec, score
from fleetlens.evaluation.requests import EvaluationRequest
from fleetlens.evaluation.store import EvalStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.scope import Scope
from fleetlens.testing import Server

from .test_eval_support import start_worker, toy_suite, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def judge_url() -> Iterator[str]:
    """A loopback OpenAI-compatible judge: score 1 when the response is the reference."""

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        prompt = str(body["prompt"])
        response = prompt.split("RESPONSE:")[1].split("REFERENCE:")[0].strip()
        reference = prompt.split("REFERENCE:")[1].strip()
        ok = response == reference
        text = f"SCORE: {1 if ok else 0}\n" + (
            "The response states the reference answer." if ok else "It does not match."
        )
        return {"choices": [{"index": i, "text": text} for i in range(int(body.get("n", 1)))]}

    httpd, url = json_endpoint(answer, 0.0)
    try:
        yield url
    finally:
        httpd.shutdown()
        httpd.server_close()


def _spec(url: str, **over: Any) -> dict[str, Any]:
    judge = {
        "adapter": {"kind": "openai", "baseUrl": url, "model": "judge-small"},
        "model": "judge-small", "modelVersion": "2026-10", "promptVersion": "p3",
        "rubricVersion": "r1", "temperature": 0.0, "samples": 2,
        "prompt": "Grade it.\nQUESTION: {prompt}\nRESPONSE: {response}\nREFERENCE: {reference}",
        **over,
    }  # fmt: skip
    return {"name": "judged", "metrics": ["judge"], "judge": judge}


def test_judge_scores_each_example_with_its_rationale(judge_url: str) -> None:
    spec = normalize_spec(_spec(judge_url))
    right = score(spec, {"id": "1", "prompt": "q1", "answer": "answer 1"}, Generation(["answer 1"]))
    wrong = score(spec, {"id": "2", "prompt": "q2", "answer": "answer 2"}, Generation(["nope"]))
    assert right["judge_score"] == 1.0 and "states the reference" in right["judge_rationale"]
    assert wrong["judge_score"] == 0.0 and "does not match" in wrong["judge_rationale"]
    summary = aggregate({"1": right, "2": wrong})
    assert summary["judge_score"]["mean"] == 0.5 and "judge_rationale" not in summary


def test_judge_configuration_is_versioned_and_part_of_the_cache_key(
    judge_url: str, metadata_url: str
) -> None:
    meta = MetadataStore(metadata_url)
    try:
        evals = EvalStore(meta)
        scope = Scope(tenant="acme", role="admin", actor="alice")
        suite = toy_suite(4)
        examples = suite["benchmarks"][0]["examples"]

        def req(**over: Any) -> EvaluationRequest:
            bench = {**_spec(judge_url, **over), "source": "inline", "examples": examples}
            return EvaluationRequest(
                adapter={"kind": "callable", "target": "tests.test_eval_support:echo_answer"},
                suite={"name": "judged", "version": "1", "benchmarks": [bench]},
                model_hash="sha256:m",
            )

        base = evals.submit(scope, req())
        keys = {base.cache_key}
        for change in (
            {"rubricVersion": "r2"},
            {"promptVersion": "p4"},
            {"modelVersion": "2026-11"},
            {"temperature": 0.7},
            {"samples": 3},
        ):
            keys.add(evals.submit(scope, req(**change)).cache_key)
        assert len(keys) == 6  # every field that can change a verdict changes the key
        with pytest.raises(ConfigError, match="rubricVersion"):
            evals.submit(scope, req(rubricVersion=""))
    finally:
        meta.engine.dispose()


def test_a_judged_evaluation_completes_through_the_api_and_a_real_worker(
    judge_url: str, tmp_path: Any
) -> None:
    """A worker's results carry the judge's rationale as text beside its score: the API took
    them as numbers only and answered every completion with 422 (issue 20)."""
    srv = Server(str(tmp_path / "data"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "3600"}).start()
    worker = None
    try:
        examples = toy_suite(4)["benchmarks"][0]["examples"]
        bench = {**_spec(judge_url), "version": "1", "source": "inline", "examples": examples}
        status, ev = srv.request(
            "POST",
            "/v1/evaluations",
            {
                "adapter": {"kind": "callable", "target": "tests.test_eval_support:echo_answer"},
                "suite": {"name": "judged", "version": "1", "benchmarks": [bench]},
            },
        )
        assert status == 202, ev
        worker = start_worker(srv, "--idle-exit", "3")
        done = wait_for(srv, ev["evaluationId"], 120)
        assert done["state"] == "COMPLETED", done["error"]
        assert done["metrics"]["judged"]["judge_score"]["mean"] == 1.0
        rows = srv.get(f"/v1/evaluations/{ev['evaluationId']}/examples")["examples"]
        rows = [r for r in rows if r["metric"] == "judge_score"]  # not latency_ms, tokens_*
        assert len(rows) == 4 and all("states the reference" in r["rationale"] for r in rows)
    finally:
        if worker is not None and worker.poll() is None:
            worker.terminate()
            worker.wait(10)
        srv.stop()
