"""What fleetlens costs the training thread per step, with the collector up and down.

Measures ``with run.step(i): pass`` plus ``run.log(i, **10 scalars)``, one perf_counter_ns
timing per iteration after a warmup, against a baseline of appending the same dict to a list,
and against wandb (offline) and MLflow (file store) when they are installed. Human-readable
lines go to stderr; the last line of stdout is one JSON object for CI to read.

    python bench/sdk_overhead.py [--quick] [--steps N] [--server URL]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fleetlens

GOAL_US = 3.0
SCALARS = {f"metric_{k}": 0.1 * k for k in range(10)}


class _Ack(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _percentiles(ns: list[int]) -> tuple[float, float]:
    ns.sort()
    return ns[len(ns) // 2] / 1000, ns[min(len(ns) - 1, int(len(ns) * 0.99))] / 1000


def _time_loop(body: Callable[[int], None], steps: int, warmup: int) -> tuple[float, float]:
    for i in range(warmup):
        body(i)
    out = [0] * steps
    clock = time.perf_counter_ns
    for i in range(steps):
        t0 = clock()
        body(i)
        out[i] = clock() - t0
    return _percentiles(out)


def _measure_sdk(server: str, steps: int, warmup: int, spool: str) -> tuple[float, float, int]:
    run = fleetlens.init(
        project="bench",
        run_id=f"bench-{os.getpid()}-{time.time_ns()}",
        server=server,
        spool_dir=spool,
        install_signal_handler=False,
        exit_flush_timeout=2.0,
        send_timeout=1.0,
    )
    s = SCALARS

    def body(i: int) -> None:
        with run.step(i):
            pass
        run.log(i, **s)

    median, p99 = _time_loop(body, steps, warmup)
    run.finish()
    return median, p99, int(run.stats().get("dropped", 0))


def _peers(steps: int, warmup: int, tmp: str) -> dict[str, float]:
    peers: dict[str, float] = {}
    n = max(100, steps // 20)  # peers are ~100x slower; fewer iterations give the same median
    try:
        import wandb  # type: ignore[import-not-found]

        wrun = wandb.init(mode="offline", dir=tmp, project="bench")
        peers["wandb_offline"] = _time_loop(lambda i: wrun.log(SCALARS, step=i), n, 10)[0]
        wrun.finish()
    except Exception:  # not installed or not working here: skip silently
        pass
    try:
        import mlflow  # type: ignore[import-not-found]

        # MLflow's file store is in maintenance mode; its default backend now is SQLite.
        mlflow.set_tracking_uri("sqlite:///" + os.path.join(tmp, "mlflow.db"))
        with mlflow.start_run():
            log = mlflow.log_metrics
            peers["mlflow_sqlite"] = _time_loop(lambda i: log(SCALARS, step=i), n, 10)[0]
    except Exception:
        pass
    return peers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds, for CI smoke runs")
    ap.add_argument("--steps", type=int, default=None, help="timed iterations per scenario")
    ap.add_argument("--server", default=None, help="use this collector instead of a local one")
    args = ap.parse_args(argv)
    steps = args.steps or (20_000 if args.quick else 200_000)
    warmup = min(2_000, steps // 10)

    httpd: ThreadingHTTPServer | None = None
    server = args.server
    if server is None:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Ack)
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        server = f"http://127.0.0.1:{httpd.server_address[1]}"

    with tempfile.TemporaryDirectory(prefix="fleetlens-bench-") as tmp:
        log: list[dict[str, float]] = []
        base_median, base_p99 = _time_loop(lambda i: log.append(dict(SCALARS)), steps, warmup)
        log.clear()
        up = _measure_sdk(server, steps, warmup, os.path.join(tmp, "up"))
        down = _measure_sdk(
            f"http://127.0.0.1:{_closed_port()}", steps, warmup, os.path.join(tmp, "down")
        )
        peers = _peers(steps, warmup, tmp)
    if httpd is not None:
        httpd.shutdown()
        httpd.server_close()

    err = sys.stderr
    print(f"steps timed per scenario: {steps} (warmup {warmup})", file=err)
    print(
        f"baseline list.append(dict): median {base_median:.2f} us  p99 {base_p99:.2f} us", file=err
    )
    print(f"fleetlens, collector up:   median {up[0]:.2f} us  p99 {up[1]:.2f} us", file=err)
    print(f"fleetlens, collector down: median {down[0]:.2f} us  p99 {down[1]:.2f} us", file=err)
    for name, median in peers.items():
        print(f"{name}: median {median:.1f} us", file=err)
    result = {
        "median_us": round(up[0], 3),
        "p99_us": round(up[1], 3),
        "median_us_collector_down": round(down[0], 3),
        "p99_us_collector_down": round(down[1], 3),
        "baseline_median_us": round(base_median, 3),
        "steps": steps,
        "peers": {k: round(v, 1) for k, v in peers.items()},
        "records_dropped": up[2] + down[2],
        "goal_median_us": GOAL_US,
        # How many times cheaper than the cheapest peer measured in this run (goal: >= 10).
        "peer_ratio_min": round(min(peers.values()) / max(up[0], down[0]), 1) if peers else None,
        "ok": up[0] < GOAL_US
        and down[0] < GOAL_US
        and all(v >= 10 * max(up[0], down[0]) for v in peers.values()),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
