"""What fleetlens costs the training thread per step, with the collector up and down.

Measures ``with run.step(i): pass`` plus ``run.log(i, **10 scalars)``, one perf_counter_ns
timing per iteration after a warmup, against a baseline of appending the same dict to a list,
and against wandb (offline), MLflow (SQLite store) and prometheus_client (10 gauges set, a step
counter and a step-time histogram) when they are installed.

Beside the training thread's time, ``process_cpu_us_per_step`` is the whole process's CPU time
(training thread plus the exporter: buffering, encoding, gzip, sending) over the timed steps and
the run's ``finish()``, per step; the collector acknowledging the batches runs in another
process, so its CPU is not counted. Goal: <= 5 us. The same figure is given for each peer
(wandb's own service process is not counted: it is a separate process). Human-readable lines go
to stderr; the last line of stdout is one JSON object for CI to read.

    python bench/sdk_overhead.py [--quick] [--steps N] [--server URL]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fleetlens

GOAL_US = 3.0
GOAL_PROCESS_CPU_US = 5.0
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


def _time_loop(
    body: Callable[[int], object], steps: int, warmup: int, done: Callable[[], object] = tuple
) -> tuple[float, float, float]:
    """(median us, p99 us, process CPU us per step over the timed steps and ``done()``)."""
    for i in range(warmup):
        body(i)
    # Garbage left by imports and set-up (the SDK's, a peer's) is collected before the clock
    # starts, as a training process has long done by its first step; the collector stays on
    # while timing, so the collections that the per-step objects cause are counted.
    gc.collect()
    out = [0] * steps
    clock = time.perf_counter_ns
    cpu0 = time.process_time()
    for i in range(steps):
        t0 = clock()
        body(i)
        out[i] = clock() - t0
    done()
    cpu_us = (time.process_time() - cpu0) * 1e6 / steps
    return (*_percentiles(out), cpu_us)


def _serve_acks(port: int) -> None:
    """The stand-in collector: answers every POST 200, in its own process."""
    httpd = ThreadingHTTPServer(("127.0.0.1", port), _Ack)
    httpd.daemon_threads = True
    httpd.serve_forever()


def _start_ack_process() -> tuple[subprocess.Popen[bytes], str]:
    port = _closed_port()
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve-acks", str(port)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the ack server did not start")


def _prometheus_body() -> Callable[[int], None]:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    reg = CollectorRegistry()
    gauges = [(Gauge(k, k, registry=reg), v) for k, v in SCALARS.items()]
    steps = Counter("train_steps", "steps", registry=reg)
    step_time = Histogram("train_step_seconds", "step time", registry=reg)

    def body(i: int) -> None:
        t0 = time.perf_counter()
        steps.inc()
        step_time.observe(time.perf_counter() - t0)
        for g, v in gauges:
            g.set(v)

    return body


def _measure_sdk(
    server: str, steps: int, warmup: int, spool: str
) -> tuple[float, float, float, int]:
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

    median, p99, cpu = _time_loop(body, steps, warmup, run.finish)
    return median, p99, cpu, int(run.stats().get("dropped", 0))


def _peers(steps: int, warmup: int, tmp: str) -> dict[str, tuple[float, float]]:
    """Per peer: (median us in the training thread, process CPU us per step)."""
    peers: dict[str, tuple[float, float]] = {}
    n = max(100, steps // 20)  # peers are ~100x slower; fewer iterations give the same median
    try:
        import wandb  # type: ignore[import-not-found]

        wrun = wandb.init(mode="offline", dir=tmp, project="bench")
        m, _, cpu = _time_loop(lambda i: wrun.log(SCALARS, step=i), n, 10, wrun.finish)
        peers["wandb_offline"] = (m, cpu)
    except Exception:  # not installed or not working here: skip silently
        pass
    try:
        import mlflow  # type: ignore[import-not-found]

        # MLflow's file store is in maintenance mode; its default backend now is SQLite.
        mlflow.set_tracking_uri("sqlite:///" + os.path.join(tmp, "mlflow.db"))
        with mlflow.start_run():
            log = mlflow.log_metrics
            m, _, cpu = _time_loop(lambda i: log(SCALARS, step=i), n, 10)
            peers["mlflow_sqlite"] = (m, cpu)
    except Exception:
        pass
    try:
        m, _, cpu = _time_loop(_prometheus_body(), steps, warmup)
        peers["prometheus_client"] = (m, cpu)
    except Exception:
        pass
    return peers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds, for CI smoke runs")
    ap.add_argument("--steps", type=int, default=None, help="timed iterations per scenario")
    ap.add_argument("--server", default=None, help="use this collector instead of a local one")
    ap.add_argument("--serve-acks", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_acks is not None:
        _serve_acks(args.serve_acks)
        return 0
    steps = args.steps or (20_000 if args.quick else 200_000)
    warmup = min(2_000, steps // 10)

    acks: subprocess.Popen[bytes] | None = None
    server = args.server
    if server is None:
        acks, server = _start_ack_process()

    with tempfile.TemporaryDirectory(prefix="fleetlens-bench-") as tmp:
        log: list[dict[str, float]] = []
        base = _time_loop(lambda i: log.append(dict(SCALARS)), steps, warmup, log.clear)
        base_median, base_p99, base_cpu = base
        try:
            up = _measure_sdk(server, steps, warmup, os.path.join(tmp, "up"))
        finally:
            if acks is not None:
                acks.kill()
                acks.wait()
        down = _measure_sdk(
            f"http://127.0.0.1:{_closed_port()}", steps, warmup, os.path.join(tmp, "down")
        )
        peers = _peers(steps, warmup, tmp)

    err = sys.stderr
    print(f"steps timed per scenario: {steps} (warmup {warmup})", file=err)
    print(
        f"baseline list.append(dict): median {base_median:.2f} us  p99 {base_p99:.2f} us", file=err
    )
    print(
        f"fleetlens, collector up:   median {up[0]:.2f} us  p99 {up[1]:.2f} us  "
        f"process CPU {up[2]:.2f} us/step (baseline {base_cpu:.2f})",
        file=err,
    )
    print(
        f"fleetlens, collector down: median {down[0]:.2f} us  p99 {down[1]:.2f} us  "
        f"process CPU {down[2]:.2f} us/step",
        file=err,
    )
    for name, (median, cpu) in peers.items():
        print(f"{name}: median {median:.1f} us  process CPU {cpu:.1f} us/step", file=err)
    medians = {k: v[0] for k, v in peers.items()}
    # prometheus_client keeps numbers in memory and sends nothing: not a logger to compare with.
    loggers = {k: v for k, v in medians.items() if k != "prometheus_client"}
    slowest = max(up[0], down[0])
    result = {
        "median_us": round(up[0], 3),
        "p99_us": round(up[1], 3),
        "median_us_collector_down": round(down[0], 3),
        "p99_us_collector_down": round(down[1], 3),
        "baseline_median_us": round(base_median, 3),
        "process_cpu_us_per_step": round(up[2], 2),
        "process_cpu_us_per_step_collector_down": round(down[2], 2),
        "baseline_process_cpu_us_per_step": round(base_cpu, 2),
        "steps": steps,
        "peers": {k: round(v, 1) for k, v in medians.items()},
        "peers_process_cpu_us_per_step": {k: round(v[1], 1) for k, v in peers.items()},
        "records_dropped": up[3] + down[3],
        "goal_median_us": GOAL_US,
        "goal_process_cpu_us_per_step": GOAL_PROCESS_CPU_US,
        # How many times cheaper than the cheapest logging peer in this run (goal: >= 10).
        "peer_ratio_min": round(min(loggers.values()) / slowest, 1) if loggers else None,
        "ok": up[0] < GOAL_US
        and down[0] < GOAL_US
        and up[2] <= GOAL_PROCESS_CPU_US
        and all(v >= 10 * slowest for v in loggers.values()),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
