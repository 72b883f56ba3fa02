"""The server's CPU per rank-step of ingest, beside Prometheus and a bare ASGI app, on one core.

The server (``fleetlens serve`` on the embedded default, its monitoring, alerting and
remediation on) is pinned to the last core with ``taskset``; the generator
(:mod:`bench._ingest_gen`) to the first. The generator replays the exact bodies a real SDK
rank sends (:mod:`bench._ingest_bodies`: captured from a real ``fleetlens.init`` run, rewritten
per rank and step): once a second per rank a step row with 4 phases and 10 scalars, directly
(one request per rank-step) or as node relays forward them (one ``/v1/ingest/batches`` request
per node of 8 ranks a second). One rank is slowed by 15% halfway. Each level runs ``seconds``
on a fresh server. In the same run, on the same core and bytes:

- a bare ASGI app under the same uvicorn (:mod:`bench._bare_asgi`): the floor of a Python
  HTTP route that reads its body;
- Prometheus's remote-write receiver fed the same samples (15 series a rank-step), one request a
  rank-step and one a node.

Figures per level (stderr, one JSON line each) and in the result:
- ``server_us_per_rank_step``: the server's CPU (``/proc``, user + system) from the first
  request to the last answer, per rank-step stored;
- ``requests_per_s``, ``ack_p50_s`` / ``ack_p99_s`` (from a request's due time to its 200),
  ``lost`` (offered, never stored), ``duplicates`` (stored twice), ``rss_mb`` (peak),
  ``straggler_found_steps`` (from the slowdown to ``/v1/runs/{run}/stragglers`` naming it),
  ``stored_per_s`` (acknowledged within the window and 2 s, a second);
- held: nothing lost or doubled, ack p99 < 2 s, the straggler within 5 steps, and all of it
  acknowledged within the window and 2 s.

Result keys: ``server_us_per_rank_step_direct`` / ``_relay`` (at the largest level held, else
the smallest tried), ``max_ranks_direct_one_core`` / ``max_ranks_relay_one_core``,
``overload_stored_ratio`` (stored a second at 4x the held direct level over stored at it), the
baselines' ``prometheus_us_per_rank_step`` / ``_relay`` and ``bare_asgi_us_per_request`` /
``_relay``, and the goals of issue 35 with ``ok``.

    python bench/ingest_cost.py [--quick] [--ranks 256,1024,4096] [--relay-ranks 1024,4096]
                                [--seconds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import emit, proc_cpu_s, rss_mb
from bench._ingest_bodies import REMOTE_WRITE_HEADERS, Bodies, capture, envelope, remote_write
from bench._ingest_gen import Outcome, Plan, Request, drive, spread

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOALS = {
    "server_us_per_rank_step_direct": 200.0,
    "server_us_per_rank_step_relay": 40.0,
    "max_ranks_direct_one_core": 4096,
    "max_ranks_relay_one_core": 16384,
    "overload_stored_ratio": 0.9,
}
_CORES = sorted(os.sched_getaffinity(0))
SERVER_CORE, GEN_CORE = _CORES[-1], _CORES[0]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer in {timeout} s")


@contextmanager
def _process(kind: str, workdir: str) -> Iterator[tuple[subprocess.Popen[bytes], int, str]]:
    """``kind`` (fleetlens, bare, prometheus) pinned to the server core: (process, port, data)."""
    port = _port()
    data = tempfile.mkdtemp(prefix=f"{kind}-", dir=workdir)
    pin = ["taskset", "-c", str(SERVER_CORE)]
    if kind == "fleetlens":
        cmd = [sys.executable, "-m", "fleetlens", "serve", "--data", data, "--port", str(port)]
        ready = f"http://127.0.0.1:{port}/healthz"
    elif kind == "bare":
        cmd = [sys.executable, "-m", "uvicorn", "bench._bare_asgi:app", "--port", str(port),
               "--http", "httptools", "--loop", "uvloop", "--log-level", "warning",
               "--no-access-log"]  # fmt: skip
        ready = f"http://127.0.0.1:{port}/"
    else:
        cfg = os.path.join(data, "prometheus.yml")
        with open(cfg, "w") as fh:
            fh.write("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
        cmd = ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={data}/tsdb",
               f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver",
               "--log.level=warn"]  # fmt: skip
        ready = f"http://127.0.0.1:{port}/-/ready"
    log = open(os.path.join(data, "log"), "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(pin + cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        _ready(ready, proc)
        yield proc, port, data
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _ahead(make: Callable[[int], list[Request]], seconds: int) -> Callable[[int], list[Request]]:
    """``make`` run one second ahead in a thread (zlib lets go of the interpreter while it
    compresses), so that making a second's bodies does not hold up sending the last's."""
    made: queue.Queue[list[Request]] = queue.Queue(maxsize=2)

    def work() -> None:
        for k in range(seconds):
            made.put(make(k))

    threading.Thread(target=work, daemon=True).start()
    return lambda k: made.get()


def _plan(kind: str, bodies: Bodies, ranks: int, seconds: int, relay: bool, wall0: float) -> Plan:
    """What ``kind`` gets each second: the SDK's bodies (fleetlens and bare: the same bytes),
    or the same samples as remote write (prometheus); a request a rank, or a node."""
    nodes = (ranks + 7) // 8

    def make(k: int) -> list[Request]:
        out = []
        if relay:
            for n, due in zip(range(nodes), spread(nodes, k), strict=True):
                members = range(8 * n, min(8 * n + 8, ranks))
                if kind == "prometheus":
                    body = remote_write(bodies.run_id, list(members), k, wall0 + due)
                    out.append(Request("/api/v1/write", REMOTE_WRITE_HEADERS, body, n,
                                       len(members), due))  # fmt: skip
                    continue
                body, headers, frames = envelope([bodies.step(r, k, wall0 + due) for r in members])
                out.append(Request("/v1/ingest/batches", headers, body, n, len(members), due,
                                   frames))  # fmt: skip
            return out
        for r, due in zip(range(ranks), spread(ranks, k), strict=True):
            if kind == "prometheus":
                body = remote_write(bodies.run_id, [r], k, wall0 + due)
                out.append(Request("/api/v1/write", REMOTE_WRITE_HEADERS, body, r, 1, due))
            else:
                body, headers = bodies.step(r, k, wall0 + due)
                out.append(Request("/v1/ingest", headers, body, r, 1, due))
        return out

    conns = min(nodes if relay else ranks, 1024)
    return Plan(_ahead(make, seconds), seconds, conns)


def _stored(data: str, run_id: str, seconds: int) -> tuple[int, int]:
    """(step rows, distinct (rank, step)) of ``run_id`` stored in ``data``'s telemetry."""
    from fleetlens.store.chdb_store import ChdbStore

    store = ChdbStore(os.path.join(data, "telemetry"))
    try:
        got = store.query(
            "SELECT count() AS n, uniqExact(rank, step) AS u FROM fleetlens.steps "
            f"WHERE run_id = '{run_id}' AND step >= 0 AND step < {seconds}"
        ).to_pylist()[0]
    finally:
        store.close()
    return int(got["n"]), int(got["u"])


def _watch(port: int, run_id: str, pid: int, slow_from: int, wall0: float, stop: threading.Event,
           seen: dict[str, Any]) -> None:  # fmt: skip
    """Sample the server's RSS and, from the slowdown on, ask for the run's stragglers."""
    seen["rss"] = []
    while not stop.wait(1.0):
        try:
            seen["rss"].append(rss_mb(pid))
        except OSError:  # it ended
            return
        k = int(time.time() - wall0)
        if run_id and k >= slow_from and "found" not in seen:
            try:
                url = f"http://127.0.0.1:{port}/v1/runs/{run_id}/stragglers"
                with urllib.request.urlopen(url, timeout=5) as r:
                    for f in json.load(r).get("stragglers", []):
                        if seen["slow_rank"] in f.get("ranks", []):
                            seen["found"] = k - slow_from
            except OSError:
                pass


def level(kind: str, ranks: int, seconds: int, relay: bool, workdir: str,
          bodies0: tuple[Any, Any, dict[str, str]]) -> dict[str, Any]:  # fmt: skip
    """One level on a fresh ``kind`` server: its figures."""
    run_id = f"cost-{'relay' if relay else 'direct'}-{ranks}"
    slow_rank, slow_from = ranks // 3, seconds // 2
    bodies = Bodies(*bodies0, run_id=run_id, world=ranks, slow_rank=slow_rank,
                    slow_from=slow_from)  # fmt: skip
    with _process(kind, workdir) as (proc, port, data):
        if kind == "fleetlens":  # each rank's first body: placement, job start (not measured)
            hello = [Request("/v1/ingest", h, b, r, 0, 0.0)
                     for r in range(ranks) for b, h in [bodies.hello(r, time.time())]]  # fmt: skip
            drive("127.0.0.1", port, Plan(lambda k: hello, 1, min(ranks, 256)))
        wall0 = time.time() + 0.2
        plan = _plan(kind, bodies, ranks, seconds, relay, wall0)
        seen: dict[str, Any] = {"slow_rank": slow_rank}
        stop = threading.Event()
        watched = run_id if kind == "fleetlens" else ""
        watcher = threading.Thread(
            target=_watch, args=(port, watched, proc.pid, slow_from, wall0, stop, seen)
        )
        watcher.start()
        cpu0 = proc_cpu_s(proc.pid)
        t0 = time.monotonic()
        out: Outcome = drive("127.0.0.1", port, plan)
        took = time.monotonic() - t0
        cpu = proc_cpu_s(proc.pid) - cpu0
        if watched and "found" not in seen:
            time.sleep(6.0)  # a last monitoring pass
        stop.set()
        watcher.join()
    offered = ranks * seconds
    stored = dup = 0
    if kind == "fleetlens":
        n, stored = _stored(data, run_id, seconds)
        dup = n - stored
    else:
        stored = out.acked_rank_steps
    shutil.rmtree(data, ignore_errors=True)
    lat = np.array(out.latencies or [float("inf")])
    in_time = out.acked_by(seconds + 2.0)
    res = {
        "kind": kind, "relay": relay, "ranks": ranks, "seconds": seconds,
        "server_us_per_rank_step": round(cpu * 1e6 / max(stored, 1), 1),
        "server_cores": round(cpu / took, 2),
        "requests_per_s": round(out.requests / seconds, 1),
        "ack_p50_s": round(float(np.percentile(lat, 50)), 3),
        "ack_p99_s": round(float(np.percentile(lat, 99)), 3),
        "lost": offered - stored, "duplicates": dup,
        "stored_per_s": round(in_time / seconds, 1),
        "refused": out.refused, "errors": out.errors,
        "rss_mb": round(max(seen.get("rss") or [0.0]), 1),
        "straggler_found_steps": seen.get("found"),
        "driver_lag_p99_s": round(float(np.percentile(out.lag_s or [0.0], 99)), 3),
        "drain_s": round(took - seconds, 1),
    }  # fmt: skip
    res["held"] = bool(
        res["lost"] == 0 and dup == 0 and res["ack_p99_s"] < 2.0 and in_time == offered
        and (kind != "fleetlens" or (res["straggler_found_steps"] is not None
                                     and res["straggler_found_steps"] <= 5))
    )  # fmt: skip
    print(json.dumps(res), file=sys.stderr, flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64 direct, 256 relayed, 5 s (CI)")
    ap.add_argument("--ranks", default="", help="direct levels, e.g. 256,1024,4096")
    ap.add_argument("--relay-ranks", default="", help="relayed levels, e.g. 1024,4096,16384")
    ap.add_argument("--seconds", type=int, default=0, help="seconds per level (30)")
    args = ap.parse_args()
    os.sched_setaffinity(0, {GEN_CORE})  # the generator's threads inherit it
    direct = [int(x) for x in args.ranks.split(",") if x] or (
        [64] if args.quick else [256, 1024, 4096]
    )
    relayed = [int(x) for x in args.relay_ranks.split(",") if x] or (
        [256] if args.quick else [1024, 4096, 16384]
    )
    seconds = args.seconds or (5 if args.quick else 30)
    workdir = tempfile.mkdtemp(prefix="fl-ingest-cost-")
    captured = capture()
    result: dict[str, Any] = {"bench": "ingest_cost", "quick": args.quick, "seconds": seconds,
                              "server_core": SERVER_CORE, "generator_core": GEN_CORE}  # fmt: skip
    try:
        for relay, levels in ((False, direct), (True, relayed)):
            name = "relay" if relay else "direct"
            tried = [level("fleetlens", n, seconds, relay, workdir, captured) for n in levels]
            held = [r for r in tried if r["held"]]
            top = held[-1] if held else tried[0]
            result[f"server_us_per_rank_step_{name}"] = top["server_us_per_rank_step"]
            result[f"max_ranks_{name}_one_core"] = held[-1]["ranks"] if held else 0
            result[f"levels_{name}"] = tried
            # the baselines at the same level, on the same core and bytes
            prom = level("prometheus", top["ranks"], seconds, relay, workdir, captured)
            bare = level("bare", top["ranks"], seconds, relay, workdir, captured)
            suffix = "_relay" if relay else ""
            result[f"prometheus_us_per_rank_step{suffix}"] = prom["server_us_per_rank_step"]
            per_request = bare["server_us_per_rank_step"] * (8 if relay else 1)
            result[f"bare_asgi_us_per_request{suffix}"] = round(per_request, 1)
            result[f"bare_asgi_us_per_rank_step{suffix}"] = bare["server_us_per_rank_step"]
        base = max(result["max_ranks_direct_one_core"], direct[0])
        at = next(r for r in result["levels_direct"] if r["ranks"] == base)
        over = level("fleetlens", 4 * base, seconds, False, workdir, captured)
        result["overload_stored_ratio"] = round(
            over["stored_per_s"] / max(at["stored_per_s"], 1e-9), 3
        )
        result["overload"] = over
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result["goals"] = GOALS
    result["ok"] = (
        result["server_us_per_rank_step_direct"] <= GOALS["server_us_per_rank_step_direct"]
        and result["server_us_per_rank_step_relay"] <= GOALS["server_us_per_rank_step_relay"]
        and result["max_ranks_direct_one_core"] >= GOALS["max_ranks_direct_one_core"]
        and result["max_ranks_relay_one_core"] >= GOALS["max_ranks_relay_one_core"]
        and result["overload_stored_ratio"] >= GOALS["overload_stored_ratio"]
    )
    emit(result)


if __name__ == "__main__":
    main()
