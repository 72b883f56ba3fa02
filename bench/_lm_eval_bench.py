"""bench/eval.py's comparison with lm-evaluation-harness: the same task YAML, the same tiny model.

lm_eval (``simple_evaluate``, the ``hf`` model, batch size 1, ``log_samples``) and fleetlens
(``fleetlens eval worker`` processes through the API, the ``hf`` adapter) evaluate the MMLU dev
questions lm-eval ships (bench/_tiny_lm.py) on a tiny GPT-2 built here; their per-example acc
and acc_norm are compared, and their wall times. A model behind an OpenAI-style endpoint
(``echo`` + ``logprobs``, 20 ms a request) measures the same task I/O-bound.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import _tiny_lm as tiny
from _common import json_endpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK = "mmlu_dev_local"


def call(url: str, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of processes (Linux /proc), all their threads."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def workers(
    url: str, n: int, tag: str, env: dict[str, str] | None = None, preload: str = ""
) -> Iterator[list[int]]:
    """``n`` worker processes, past their imports (and ``preload``, an adapter spec in JSON,
    loaded) and polling before the clock starts."""
    cmd = [sys.executable, "-m", "fleetlens.evaluation", "eval", "worker", "--server", url,
           "--poll-s", "0.02", "--idle-exit", "600"]  # fmt: skip
    if preload:
        cmd += ["--preload-adapter", preload]
    with tempfile.TemporaryDirectory() as logs:
        procs = []
        for i in range(n):
            with open(os.path.join(logs, f"{i}.log"), "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [*cmd, "--worker-id", f"{tag}{i}"],
                        cwd=ROOT,
                        env={**os.environ, **(env or {})},
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                    )
                )
        try:
            deadline = time.monotonic() + 120
            for i, p in enumerate(procs):
                while b": polling" not in _read(os.path.join(logs, f"{i}.log")):
                    if p.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"worker {i} did not start: {_read(logs + f'/{i}.log')!r}"
                        )
                    time.sleep(0.05)
            yield [p.pid for p in procs]
        finally:
            for p in procs:
                p.terminate()
                p.wait(10)


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def evaluate(url: str, request: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Submit and wait; the seconds from the request to the completed evaluation."""
    t0 = time.perf_counter()
    ev = call(url, "POST", "/v1/evaluations", request)
    while ev["state"] not in ("COMPLETED", "FAILED"):
        time.sleep(0.02)
        ev = call(url, "GET", f"/v1/evaluations/{ev['evaluationId']}")
    elapsed = time.perf_counter() - t0
    if ev["state"] != "COMPLETED":
        raise RuntimeError(f"evaluation failed: {ev['error']}")
    return elapsed, ev


def per_example(url: str, evaluation_id: str) -> dict[str, dict[str, float]]:
    rows = call(url, "GET", f"/v1/evaluations/{evaluation_id}/examples?limit=1000000")
    out: dict[str, dict[str, float]] = {}
    for r in rows["examples"]:
        if r["metric"] in ("acc", "acc_norm"):
            out.setdefault(r["exampleId"], {})[r["metric"]] = float(r["value"])
    return out


def max_abs_diff(ours: dict[str, dict[str, float]], ref: dict[str, dict[str, Any]]) -> float:
    if sorted(ours) != sorted(ref):
        return float("inf")
    return max(abs(ours[d][m] - float(ref[d][m])) for d in ref for m in ("acc", "acc_norm"))


def echo_endpoint(latency_s: float) -> tuple[ThreadingHTTPServer, str]:
    """An OpenAI-style completions endpoint that scores ``echo`` prompts: word-sized tokens with
    their text offsets and a deterministic log-probability each; one sleep per request."""
    import re

    word = re.compile(r"\s*\S+|\s+")

    def score(text: str) -> dict[str, Any]:
        tokens = word.findall(text)
        offsets, lps, pos = [], [], 0
        for i, t in enumerate(tokens):
            offsets.append(pos)
            pos += len(t)
            lps.append(None if i == 0 else -1.0 - (zlib.crc32(t.encode()) % 1000) / 250.0)
        top = [None if v is None else {t: v} for t, v in zip(tokens, lps, strict=True)]
        return {"tokens": tokens, "token_logprobs": lps, "text_offset": offsets,
                "top_logprobs": top}  # fmt: skip

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        return {"choices": [{"index": i, "text": p, "logprobs": score(p)}
                            for i, p in enumerate(prompts)]}  # fmt: skip

    return json_endpoint(answer, latency_s)


def request(task: str, adapter: dict[str, Any], shard: int, no_cache: bool) -> dict[str, Any]:
    bench = {"name": TASK, "version": "1", "source": "lm_eval", "task": task}
    return {"adapter": adapter, "suite": {"name": TASK, "version": "1", "benchmarks": [bench]},
            "shardSize": shard, "noCache": no_cache}  # fmt: skip


def _lm_eval_one_thread(model: str, task: str) -> tuple[dict[str, Any], float, float]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cpu0 = time.process_time()
    try:
        out, secs = tiny.run_lm_eval(model, task)
    finally:
        torch.set_num_threads(threads)
    return out, secs, time.process_time() - cpu0


def compare(
    url: str,
    server_pid: int,
    folder: str,
    docs: int | None,
    shard: int,
    mc_docs: int,
    rounds: int,
    default_threads_too: bool,
) -> dict[str, Any]:
    """The lm-eval figures of bench/eval.py's result, each the best of ``rounds`` alternating
    rounds (lm_eval, one worker, four workers) on a machine shared with other work. lm_eval and
    every fleetlens worker run with one PyTorch thread (two spinning OpenMP threads in one
    process can be many times slower on a loaded machine); ``default_threads_too``: lm_eval
    also runs once with PyTorch's default (both cores), and its faster run counts."""
    tiny.offline_env()
    model = tiny.build_model(os.path.join(folder, "model"))
    task = tiny.write_task(folder, limit=docs, task=TASK)
    mc_task = tiny.write_task(folder, limit=mc_docs, task=TASK + "_endpoint")
    n, mc_n = len(tiny.mmlu_dev_rows()[:docs]), len(tiny.mmlu_dev_rows()[:mc_docs])
    t0 = time.perf_counter()
    for module in ("lm_eval.evaluator", "lm_eval.models.huggingface", "lm_eval.tasks"):
        importlib.import_module(module)  # timed apart: importing is not evaluating
    import_s = time.perf_counter() - t0
    hf = {"kind": "hf", "path": model}
    echo = {"kind": "openai", "baseUrl": "", "model": "echo"}
    httpd, echo["baseUrl"] = echo_endpoint(0.020)
    inf = float("inf")
    lm_s, lm_cpu, secs, cpu, rates = inf, inf, {1: inf, 4: inf}, {1: inf, 4: inf}, {1: 0.0, 4: 0.0}
    diff, out, ref = 0.0, {}, {}
    try:
        for r in range(rounds):
            got, s, c = _lm_eval_one_thread(model, task)
            if r == 0:
                out, ref = got, tiny.lm_eval_per_example(got, TASK)
            diff = max(diff, max_abs_diff(tiny.lm_eval_per_example(got, TASK), ref))
            lm_s, lm_cpu = min(lm_s, s), min(lm_cpu, c)
            for count in (1, 4):
                # the model is loaded at the workers' start, as lm_eval's before its clock
                one = {"OMP_NUM_THREADS": "1"}
                with workers(url, count, f"r{r}w{count}-", one, json.dumps(hf)) as pids:
                    mc_s, _ = evaluate(url, request(mc_task, echo, shard, True))
                    rates[count] = max(rates[count], mc_n / mc_s)
                    cpu0 = cpu_seconds([server_pid, *pids])
                    took, ev = evaluate(url, request(task, hf, shard, True))
                    cpu[count] = min(cpu[count], cpu_seconds([server_pid, *pids]) - cpu0)
                    secs[count] = min(secs[count], took)
                diff = max(diff, max_abs_diff(per_example(url, ev["evaluationId"]), ref))
            print(f"round {r}: lm_eval {s:.2f} s; fleetlens 1 worker {secs[1]:.2f} s, "
                  f"4 workers {secs[4]:.2f} s (best so far); max |diff| {diff}; endpoint "
                  f"{rates[1]:.1f} / {rates[4]:.1f} ex/s", file=sys.stderr)  # fmt: skip
    finally:
        httpd.shutdown()
    lm2_s = lm2_cpu = None
    if default_threads_too:
        cpu0 = time.process_time()
        again, lm2_s = tiny.run_lm_eval(model, task)
        lm2_cpu = time.process_time() - cpu0
        diff = max(diff, max_abs_diff(tiny.lm_eval_per_example(again, TASK), ref))
        print(f"lm_eval, default threads: {lm2_s:.2f} s", file=sys.stderr)
    hit_s, hit = evaluate(url, request(task, hf, shard, False))
    if not hit["cacheHit"]:
        raise RuntimeError("the second submission was not answered from the cache")
    ours, theirs = hit["metrics"][TASK], out["results"][TASK]
    return {
        "lm_eval_version": _version(), "lm_eval_task_documents": n, "rounds": rounds,
        "agree_with_lm_eval": diff == 0.0, "max_abs_diff_acc": diff,
        "acc": ours["acc"]["mean"], "acc_norm": ours["acc_norm"]["mean"],
        "acc_lm_eval": theirs["acc,none"], "acc_norm_lm_eval": theirs["acc_norm,none"],
        "seconds_lm_eval": round(min(lm_s, lm2_s or lm_s), 2),
        "seconds_lm_eval_one_thread": round(lm_s, 2),
        "seconds_lm_eval_default_threads": _round(lm2_s),
        "seconds_lm_eval_import": round(import_s, 2),
        "seconds_1w": round(secs[1], 2), "seconds_4w": round(secs[4], 2),
        # CPU time, less at the mercy of a shared machine: lm_eval's process; the server's and
        # the workers' processes
        "cpu_seconds_lm_eval_one_thread": round(lm_cpu, 2),
        "cpu_seconds_lm_eval_default_threads": _round(lm2_cpu),
        "cpu_seconds_1w": round(cpu[1], 2), "cpu_seconds_4w": round(cpu[4], 2),
        "cache_hit_seconds": round(hit_s, 3), "mc_endpoint_documents": mc_n,
        "mc_endpoint_examples_per_s_1w": round(rates[1], 1),
        "mc_endpoint_examples_per_s_4w": round(rates[4], 1),
    }  # fmt: skip


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _version() -> str:
    from importlib.metadata import version

    return version("lm_eval")
