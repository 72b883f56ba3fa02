"""Evaluation throughput and scheduling overhead, and the comparison with lm-evaluation-harness.

One and four local ``fleetlens eval worker`` processes run an evaluation of a cheap
deterministic model behind an OpenAI-compatible HTTP endpoint that answers after ~20 ms, so what
differs between the two is how well the scheduler spreads shards. The overhead per shard is a
null worker's lease + complete round trip through the HTTP API (no model, no scoring).

Then an lm-eval task YAML (the MMLU dev questions lm-eval ships, as local JSON lines) on a tiny
GPT-2 built here, by lm_eval itself and by fleetlens with one and four workers: per-example
acc/acc_norm compared, wall times, a second submission answered from the cache, and the same
task on an endpoint model (echo + logprobs, 20 ms a request). See bench/_lm_eval_bench.py.

    python bench/eval.py [--quick]        # last line: one JSON object
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from http.server import ThreadingHTTPServer
from typing import Any

from _common import emit, json_endpoint, start_server, stop_server
from _lm_eval_bench import compare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def endpoint(latency_s: float) -> tuple[ThreadingHTTPServer, str]:
    """A generation model that answers ``answer <last word of the prompt>``."""

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        word = str(body["prompt"]).split()[-1]
        return {"choices": [{"index": 0, "text": f"answer {word}"}]}

    return json_endpoint(answer, latency_s)


def call(url: str, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r) if r.status != 204 else None


def suite(n: int, tag: str) -> dict[str, Any]:
    examples = [
        {"id": str(i), "prompt": f"question {i}", "answer": f"answer {i}"} for i in range(n)
    ]
    return {"name": tag, "version": "1", "benchmarks": [
        {"name": "qa", "version": tag, "source": "inline", "examples": examples,
         "metrics": ["exact_match"]}]}  # fmt: skip


def throughput(url: str, model_url: str, workers: int, n: int, shard: int) -> float:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fleetlens.evaluation",
                "eval",
                "worker",
                "--server",
                url,
                "--poll-s",
                "0.02",
                "--idle-exit",
                "600",
                "--worker-id",
                f"bench{i}",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(workers)
    ]
    try:
        time.sleep(3.0)  # let the workers import and start polling
        t0 = time.perf_counter()
        ev = call(url, "POST", "/v1/evaluations", {
            "adapter": {"kind": "openai", "baseUrl": model_url, "model": "echo"},
            "suite": suite(n, f"w{workers}"), "shardSize": shard, "noCache": True})  # fmt: skip
        while True:
            cur = call(url, "GET", f"/v1/evaluations/{ev['evaluationId']}")
            if cur["state"] in ("COMPLETED", "FAILED"):
                break
            time.sleep(0.02)
        elapsed = time.perf_counter() - t0
        if cur["state"] != "COMPLETED" or cur["metrics"]["qa"]["exact_match"]["mean"] != 1.0:
            raise RuntimeError(f"benchmark evaluation went wrong: {cur['state']} {cur['error']}")
        return n / elapsed
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def overhead(url: str, shards: int) -> float:
    """A null worker: lease + complete through the API, per shard, in ms."""
    import httpx

    ev = call(url, "POST", "/v1/evaluations", {
        "adapter": {"kind": "callable", "target": "x:y"}, "suite": suite(shards, "ovh"),
        "shardSize": 1, "noCache": True})  # fmt: skip
    with httpx.Client(base_url=url, timeout=60) as c:
        t0 = time.perf_counter()
        for _ in range(shards):
            sh = c.post("/v1/eval-shards/lease", json={"workerId": "null"}).json()
            scores = {e["id"]: {"exact_match": 1.0} for e in sh["examples"]}
            r = c.post(f"/v1/eval-shards/{sh['shardId']}/complete",
                       json={"leaseToken": sh["leaseToken"], "scores": scores})  # fmt: skip
            r.raise_for_status()
        elapsed = time.perf_counter() - t0
    assert call(url, "GET", f"/v1/evaluations/{ev['evaluationId']}")["state"] == "COMPLETED"
    return 1000.0 * elapsed / shards


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n, shard, nshards = (200, 10, 50) if args.quick else (600, 20, 200)
    docs, lm_shard, mc_docs, rounds = (60, 5, 60, 1) if args.quick else (None, 20, 272, 2)
    httpd, model_url = endpoint(0.020)
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as lm_dir:
        # the real `fleetlens serve`; no analysis pass competes with the scheduler while measuring
        proc, url = start_server(tmp, {"FLEETLENS_ANALYSIS_INTERVAL_S": "3600"})
        try:
            ovh = overhead(url, nshards)
            print(f"scheduler overhead {ovh:.2f} ms/shard", file=sys.stderr)
            one = throughput(url, model_url, 1, n, shard)
            print(f"1 worker: {one:.1f} examples/s", file=sys.stderr)
            four = throughput(url, model_url, 4, n, shard)
            print(f"4 workers: {four:.1f} examples/s ({four / one:.2f}x)", file=sys.stderr)
            lm = compare(url, proc.pid, lm_dir, docs, lm_shard, mc_docs, rounds, not args.quick)
        finally:
            stop_server(proc)
            httpd.shutdown()
    mc_speedup = lm["mc_endpoint_examples_per_s_4w"] / lm["mc_endpoint_examples_per_s_1w"]
    emit({
        "bench": "eval", "quick": args.quick, "examples": n, "shard_size": shard,
        "model_latency_ms": 20, "examples_per_s_1w": round(one, 1),
        "examples_per_s_4w": round(four, 1), "speedup_4w": round(four / one, 2),
        "scheduler_overhead_ms_per_shard": round(ovh, 2), **lm,
        "mc_endpoint_speedup_4w": round(mc_speedup, 2),
        # goals: lm_eval's scores, per example; four workers no slower than lm_eval on the local
        # model; 3x one worker on the endpoint model; a cache hit under a second
        "ok": lm["agree_with_lm_eval"] and lm["seconds_4w"] <= lm["seconds_lm_eval"]
        and four / one >= 3.0 and mc_speedup >= 3.0 and lm["cache_hit_seconds"] < 1.0,
    })  # fmt: skip


if __name__ == "__main__":
    main()
