"""The evaluation store on SQLite and PostgreSQL: leasing, ordering, cache, registry, gates."""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from fleetlens.errors import ConfigError, LeaseLost, PromotionRefused
from fleetlens.evaluation.benchmarks import normalize_spec
from fleetlens.evaluation.cache import canonical_hash
from fleetlens.evaluation.registry import Registry
from fleetlens.evaluation.requests import EvaluationRequest
from fleetlens.evaluation.store import EvalStore
from fleetlens.store.access import AccessStore
from fleetlens.store.graph import GraphStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.scope import Scope

from .test_eval_support import toy_suite

pytestmark = pytest.mark.unit

A = Scope(tenant="acme", role="admin", actor="alice")
EDITOR = Scope(tenant="acme", role="editor", actor="ed")
B = Scope(tenant="bolt", role="admin", actor="bob")
ECHO = {"kind": "callable", "target": "tests.test_eval_support:echo_answer"}


@pytest.fixture
def meta(metadata_url: str) -> Any:
    store = MetadataStore(metadata_url)
    yield store
    store.engine.dispose()


def _req(n: int = 20, **kw: Any) -> EvaluationRequest:
    return EvaluationRequest(**{"adapter": ECHO, "suite": toy_suite(n), "shard_size": 5, **kw})


def _drain(evals: EvalStore, scope: Scope, answer: Any = None) -> int:
    """Lease and complete every shard in this process; ``answer(example) -> score``."""
    count = 0
    while (sh := evals.lease(scope, "inproc")) is not None:
        scores = {e["id"]: {"exact_match": answer(e) if answer else 1.0} for e in sh.examples}
        evals.complete(scope, sh.shard_id, sh.lease_token, scores)
        count += 1
    return count


def test_concurrent_leases_hand_out_each_shard_exactly_once(meta: MetadataStore) -> None:
    evals = EvalStore(meta)
    evals.submit(A, _req(200))  # 40 shards
    got: list[int] = []
    lock = threading.Lock()

    def grab(i: int) -> None:
        while (sh := evals.lease(A, f"w{i}")) is not None:
            with lock:
                got.append(sh.shard_id)

    threads = [threading.Thread(target=grab, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 40 and len(set(got)) == 40
    assert evals.lease(B, "other-tenant") is None


def test_expired_lease_goes_to_another_worker_and_the_old_token_is_refused(
    meta: MetadataStore,
) -> None:
    evals = EvalStore(meta)
    ev = evals.submit(A, _req(5, max_attempts=2))
    first = evals.lease(A, "w1", lease_s=0.05)
    assert first is not None and first.attempt == 1
    evals.heartbeat(A, first.shard_id, first.lease_token, 0.05, {"0": {"exact_match": 1.0}})
    time.sleep(0.1)
    second = evals.lease(A, "w2", lease_s=30)
    assert second is not None and second.shard_id == first.shard_id
    assert second.attempt == 2 and second.completed_ids == ["0"]
    with pytest.raises(LeaseLost):
        evals.complete(A, first.shard_id, first.lease_token, {})
    with pytest.raises(LeaseLost):
        evals.heartbeat(A, first.shard_id, first.lease_token)
    scores = {e["id"]: {"exact_match": 1.0} for e in second.examples[1:]}
    out = evals.complete(A, second.shard_id, second.lease_token, scores)
    assert out.evaluation_state == "COMPLETED"
    done = evals.get(A, ev.evaluation_id)
    assert done.metrics["toy"]["exact_match"]["n"] == 5
    # A lease that expires on its last attempt fails the shard instead of looping forever.
    ev2 = evals.submit(A, _req(5, max_attempts=1, code_commit="other"))
    assert evals.lease(A, "w3", lease_s=0.01) is not None
    time.sleep(0.05)
    assert evals.lease(A, "w4") is None
    failed = evals.get(A, ev2.evaluation_id)
    assert failed.state == "FAILED" and "lease expired" in failed.error


def test_lease_order_priority_then_deadline_then_locality(meta: MetadataStore) -> None:
    evals = EvalStore(meta)
    p3 = evals.submit(A, _req(5, priority="P3", code_commit="a"))
    late = evals.submit(A, _req(5, priority="P1", deadline=time.time() + 900, code_commit="b"))
    soon = evals.submit(A, _req(5, priority="P1", deadline=time.time() + 60, code_commit="c"))
    p0 = evals.submit(A, _req(5, priority="P0", code_commit="d"))
    order = [evals.lease(A, "w").evaluation_id for _ in range(4)]  # type: ignore[union-attr]
    assert order == [p0.evaluation_id, soon.evaluation_id, late.evaluation_id,
                     p3.evaluation_id]  # fmt: skip
    x = evals.submit(A, _req(5, priority="P2", model_hash="sha256:x"))
    y = evals.submit(A, _req(5, priority="P2", model_hash="sha256:y"))
    first = evals.lease(A, "w", prefer_locality="sha256:y")
    assert first is not None and first.evaluation_id == y.evaluation_id
    assert evals.lease(A, "w").evaluation_id == x.evaluation_id  # type: ignore[union-attr]


def test_cache_hit_reuses_and_any_provenance_change_misses(meta: MetadataStore) -> None:
    evals = EvalStore(meta)
    base = _req(10, model_hash="sha256:m1", code_commit="abc", decoding={"temperature": 0})
    first = evals.submit(A, base)
    assert _drain(evals, A) == 2
    again = evals.submit(A, base)
    assert again.cache_hit and again.cached_from == first.evaluation_id
    assert again.state == "COMPLETED" and again.metrics == evals.get(A, first.evaluation_id).metrics
    assert evals.lease(A, "w") is None  # nothing ran twice
    assert evals.scores(A, again.evaluation_id) == evals.scores(A, first.evaluation_id)
    assert not evals.submit(B, base).cache_hit  # another tenant's result is never reused
    suite = toy_suite(10)
    variants = {
        "model hash": replace(base, model_hash="sha256:m2"),
        "code commit": replace(base, code_commit="abd"),
        "decoding": replace(base, decoding={"temperature": 0.7}),
        "evaluator version": replace(base, evaluator_version="fleetlens-eval-2"),
        "benchmark version": replace(base, suite={**suite, "benchmarks": [
            {**suite["benchmarks"][0], "version": "2"}]}),
        "prompt template": replace(base, suite={**suite, "benchmarks": [
            {**suite["benchmarks"][0], "promptTemplate": {"version": "v2", "text": "{prompt}"}}]}),
        "dataset": replace(base, suite=toy_suite(11)),
    }  # fmt: skip
    keys = {first.cache_key}
    for what, req in variants.items():
        out = evals.submit(A, req)
        assert not out.cache_hit, what
        keys.add(out.cache_key)
    assert len(keys) == len(variants) + 1


def _model(meta: MetadataStore, version: str) -> None:
    meta.observe("acme", "run-1", first=1.0, last=2.0, step=10)
    g = GraphStore(meta)
    g.record_checkpoint(A, "run-1", int(version), checkpoint_id=f"ck{version}",
                        checksum=f"sha256:{version * 8}")  # fmt: skip
    g.register_model_version(A, "llm", version, "run-1", checkpoint_id=f"ck{version}")


SAFE_QUALITY = [
    {"metric": "toy/exact_match", "direction": "higher", "maxRegression": 0.0, "test": "mcnemar"},
    {"metric": "safety/unsafe_rate", "direction": "lower", "maxRegression": 0.0, "hard": True},
]


def _evaluate(evals: EvalStore, version: str, quality: float, unsafe: float) -> str:
    """An evaluation of llm:version with the given share of right answers and unsafe replies."""
    n = 200
    suite = toy_suite(n)
    suite["benchmarks"].append({**suite["benchmarks"][0], "name": "safety"})
    ev = evals.submit(A, EvaluationRequest(adapter=ECHO, suite=suite, shard_size=100,
                                           model_id="llm", model_version=version))  # fmt: skip
    while (sh := evals.lease(A, "w")) is not None:
        key = "exact_match" if sh.benchmark.name == "toy" else "unsafe_rate"
        rate = quality if key == "exact_match" else unsafe
        scores = {e["id"]: {key: float(int(e["id"]) < rate * n)} for e in sh.examples}
        evals.complete(A, sh.shard_id, sh.lease_token, scores)
    assert evals.get(A, ev.evaluation_id).state == "COMPLETED"
    return ev.evaluation_id


def test_gates_and_promotion(meta: MetadataStore) -> None:
    evals = EvalStore(meta)
    reg = Registry(meta, evals, AccessStore(meta))
    for v in ("1", "2", "3"):
        _model(meta, v)
    _evaluate(evals, "1", quality=0.70, unsafe=0.02)
    # No gate yet: canary and production are refused; candidate (any name) moves freely.
    assert reg.set_alias(EDITOR, "llm", "candidate", "1").from_version is None
    with pytest.raises(PromotionRefused, match="passing gate"):
        reg.set_alias(EDITOR, "llm", "canary", "1")
    with pytest.raises(PromotionRefused, match="only an admin"):
        reg.set_alias(EDITOR, "llm", "canary", "1", override_reason="bootstrap")
    reg.set_alias(A, "llm", "canary", "1", override_reason="first production model")
    reg.set_alias(A, "llm", "production", "1", override_reason="first production model")
    assert reg.aliases(A, "llm") == {"candidate": "1", "canary": "1", "production": "1"}

    # v2: better quality, worse safety -> blocked by the hard safety gate.
    _evaluate(evals, "2", quality=0.80, unsafe=0.10)
    d2 = reg.run_gate(EDITOR, "llm", "2", SAFE_QUALITY)
    assert not d2.report.passed and d2.report.failed == ["safety/unsafe_rate"]
    checks = {c.metric: c for c in d2.report.checks}
    assert checks["toy/exact_match"].status == "pass" and checks["toy/exact_match"].paired == 200
    interval = checks["safety/unsafe_rate"].interval
    assert interval is not None and interval[0] > 0  # the whole interval is a rise
    with pytest.raises(PromotionRefused, match="failed"):
        reg.set_alias(EDITOR, "llm", "canary", "2", decision_id=d2.decision_id)

    # v3: the same quality within noise, same safety -> passes; canary, then production.
    _evaluate(evals, "3", quality=0.69, unsafe=0.02)
    d3 = reg.run_gate(EDITOR, "llm", "3", SAFE_QUALITY)
    assert d3.report.passed, d3
    assert d3.baseline_version == "1" and d3.report.checks[0].p_value == 0.5  # 2 discordant pairs
    with pytest.raises(PromotionRefused, match="not the canary"):
        reg.set_alias(EDITOR, "llm", "production", "3", decision_id=d3.decision_id)
    with pytest.raises(PromotionRefused, match="judged llm:3, not 2"):
        reg.set_alias(EDITOR, "llm", "canary", "2", decision_id=d3.decision_id)
    reg.set_alias(EDITOR, "llm", "canary", "3", decision_id=d3.decision_id)
    reg.set_alias(EDITOR, "llm", "production", "3", decision_id=d3.decision_id)
    assert reg.resolve(A, "llm", "production") == "3"
    moves = reg.history(A, "llm")
    assert [(m.alias, m.from_version, m.to_version, m.override) for m in moves] == [
        ("candidate", None, "1", False),
        ("canary", None, "1", True),
        ("production", None, "1", True),
        ("canary", "1", "3", False),
        ("production", "1", "3", False),
    ]
    audit = [e["action"] for e in AccessStore(meta).audit_log(A)]
    assert audit.count("model.alias.override") == 2 and audit.count("model.alias.move") == 3
    assert reg.decision(A, d2.decision_id).report.passed is False
    assert GraphStore(meta).model_versions(A, "llm")[2].evaluation_id is not None
    with pytest.raises(Exception, match="does not exist"):
        reg.aliases(B, "llm")


# the cache key fleetlens computed for _SENT before the benchmark spec was typed (issue 34)
_SENT_CACHE_KEY = "4c9fb40beea7eeae2b1c208999eb75e9eed4312f5ab148c676f0c3036ecad752"
_SENT = {
    "name": "toy",
    "version": 2,
    "source": "inline",
    "metrics": ["exact_match", "pass@k"],
    "k": [1, 2],
    "promptTemplate": {"version": "v1", "text": "Q: {prompt}"},
    "ownNote": {"x": [1, 2]},  # a key fleetlens does not read: kept, sent to the worker
    "examples": [{"prompt": "q0", "answer": "a"}, {"id": 7, "prompt": "q1", "answer": "b"}],
}


def test_a_benchmark_spec_is_hashed_and_leased_as_the_user_sent_it(meta: MetadataStore) -> None:
    spec = normalize_spec(copy.deepcopy(_SENT))
    assert (spec.name, spec.version, spec.k) == ("toy", "2", (1, 2))
    assert spec.prompt_template.text == "Q: {prompt}" and spec.timeout_s == 10.0
    assert spec.as_json() == _SENT and canonical_hash(spec.as_json()) == canonical_hash(_SENT)
    evals = EvalStore(meta)
    suite = {"name": "s", "version": "1", "benchmarks": [copy.deepcopy(_SENT)]}
    req = EvaluationRequest(adapter=ECHO, suite=suite, decoding={"n": 2}, model_hash="sha256:m")
    assert evals.submit(A, req).cache_key == _SENT_CACHE_KEY
    sh = evals.lease(A, "w")
    assert sh is not None and [e["id"] for e in sh.examples] == ["0", "7"]
    assert sh.benchmark.as_json() == {k: v for k, v in _SENT.items() if k != "examples"}
    with pytest.raises(ConfigError, match="k 'two' must be integers"):
        normalize_spec({**_SENT, "k": "two"})
