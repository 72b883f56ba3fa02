"""Helpers shared by the benchmarks: a server subprocess, a model endpoint, and the
one-JSON-line result."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fleetlens.testing import Server


def start_server(
    data_dir: str, env: dict[str, str] | None = None, log: str | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """``fleetlens serve`` on a free port (``fleetlens.testing.Server``), its output to ``log``
    (else a file in ``data_dir``)."""
    srv = Server(data_dir, env=dict(env or {}), log_path=log or "").start()
    assert srv.proc is not None
    return srv.proc, srv.url


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def proc_cpu_s(pid: int) -> float:
    """A process's CPU seconds so far, user and system, from ``/proc``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """A process's resident memory now, MB, from ``/proc``."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def emit(result: dict[str, Any]) -> None:
    """Human lines went to stderr; the last line of stdout is the result as one JSON object."""
    print(json.dumps(result), flush=True)


def json_endpoint(
    answer: Callable[[dict[str, Any]], dict[str, Any]], latency_s: float
) -> tuple[ThreadingHTTPServer, str]:
    """A model behind HTTP, on a loopback port in a thread: every POST's JSON body gets
    ``answer(body)`` as JSON after ``latency_s`` (an I/O-bound served model); its URL."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # no 40 ms delayed-ACK stall between header and body

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(latency_s)
            out = json.dumps(answer(body)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"
