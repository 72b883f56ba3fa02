"""A real job's traffic: N ranks, each a real SDK ``Run``, against ``fleetlens serve``.

Each rank is ``fleetlens.init`` with its default settings (its own buffer, exporter thread,
encoder, HTTP transport and spool; many ranks in this one process), stepping once a second with
4 phases and 10 scalars per step, its placement and lifecycle events. The server is ``fleetlens
serve`` on the embedded default, started fresh for each N, with its monitoring, alerting and
remediation running; everything shares this machine's cores. Partway through, one rank is
slowed by 15% (its compute; the others wait for it in their all-reduce, as in a synchronous job).

For each N, in increasing order, until one does not hold:
- ``ack_p99_s``: for the records of every 16th rank, the time from recording a step to the
  acknowledgement of the request that carried it (read from the acknowledged bodies);
- ``lost`` / ``duplicates``: from the stored rows after the run (steps and scalars per rank
  and step), against what was recorded;
- ``server_cpu_us_per_rank_step``: the server process's CPU over the stepping, per rank-step;
- ``server_rss_mb``: its peak resident memory; ``rss_flat``: the second half's peak within 15%
  of the first's;
- ``straggler_found_steps``: steps from the slowdown until the run's stragglers name the rank.
N holds when ack p99 <= 2 s, nothing is lost or stored twice, RSS is flat and the straggler is
found within 5 steps.

``max_ranks_relay``: the same through node relays, one per 8 ranks (a node), each the real relay
code (:class:`fleetlens.agent.relay.Relay`: loopback HTTP, fsync'd spool, forwarding with
``/v1/ingest/batches``) running in this process: the ranks send to their node's relay, which
the SDK would find at init. The ack latency is then end to end: from recording a step to the
server's acknowledgement of the request that carried it from the relay (every 16th relay).

    python bench/fleet_load.py [--quick] [--ranks 64,128,...] [--relay-ranks 512,...]
                               [--seconds S] [--mode direct|relay|both]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

import msgspec
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fleetlens
from bench._common import emit, proc_cpu_s, rss_mb, start_server, stop_server
from fleetlens.agent.relay import Relay, RelayConfig
from fleetlens.sdk.transport import Ack, HttpTransport
from fleetlens.wire import Batch, BatchFrame

SCALARS = {f"metric_{k}": 0.1 * k for k in range(10)}
SAMPLE_EVERY = 16
GOAL_ACK_P99_S = 2.0
GOAL_FOUND_STEPS = 5


def _step_ends(body: bytes) -> list[float]:
    """When each step record in a batch's body ended (its time plus duration)."""
    raw = gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body
    table = msgspec.msgpack.decode(raw, type=Batch).tables.get("step")
    if table is not None:
        t = table.cols.get("time")
        d = table.cols.get("duration")
        if isinstance(t, bytes) and isinstance(d, bytes):
            return (np.frombuffer(t, "<f8") + np.frombuffer(d, "<f8")).tolist()
    return []


class SampledTransport(HttpTransport):
    """The SDK's transport, noting when each step record it carried was acknowledged."""

    latencies: list[float]

    def send(self, body: bytes, headers: dict[str, str]) -> Ack | None:
        ack = super().send(body, headers)
        now = time.time()
        self.latencies.extend(now - end for end in _step_ends(body))
        return ack


class SampledRelayTransport(HttpTransport):
    """A relay's transport to the server, noting when the step records of the batches it
    forwarded were acknowledged (each frame is stored or refused on its own: all are counted,
    the bench checks for losses separately)."""

    latencies: list[float]

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str, float | None, bytes]:
        answer = super().post(body, headers)
        if answer[0] == 200:
            now = time.time()
            for frame in msgspec.msgpack.decode(body, type=list[BatchFrame]):
                self.latencies.extend(now - end for end in _step_ends(frame.body))
        return answer


def _relays(ranks: int, url: str, workdir: str, latencies: list[float]) -> list[Relay]:
    """One started relay per node of 8 ranks; every 16th samples its latencies."""
    relays = []
    for node in range((ranks + 7) // 8):
        cfg = RelayConfig(
            server=url,
            spool_dir=os.path.join(workdir, f"relay-{ranks}", str(node)),
            listen="127.0.0.1:0",
        )
        relay = Relay(cfg)
        if node % SAMPLE_EVERY == 0:
            sampled = SampledRelayTransport(url, None, cfg.timeout, path="/v1/ingest/batches")
            sampled.latencies = latencies
            relay.transport = sampled
        relays.append(relay.start())
    return relays


def _stragglers(url: str, run_id: str) -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{url}/v1/runs/{run_id}/stragglers", timeout=5) as r:
            return list(json.load(r).get("stragglers", []))
    except OSError:
        return []


def _stored(data_dir: str, run_id: str, seconds: int) -> tuple[int, int, int, int]:
    """Of the records the driver made (steps 0..seconds-1, the SCALARS): (step rows, distinct
    (rank, step), scalar rows, distinct (rank, step, name)), counting those records only."""
    from fleetlens.store.chdb_store import ChdbStore

    store = ChdbStore(os.path.join(data_dir, "telemetry"))
    try:
        s = store.query(
            "SELECT count() AS n, uniqExact(rank, step) AS u FROM fleetlens.steps "
            f"WHERE run_id = '{run_id}' AND step >= 0 AND step < {seconds}"
        ).to_pylist()[0]
        names = ", ".join(f"'{n}'" for n in SCALARS)
        c = store.query(
            "SELECT count() AS n, uniqExact(rank, step, name) AS u FROM fleetlens.scalars "
            f"WHERE run_id = '{run_id}' AND step >= 0 AND step < {seconds} AND name IN ({names})"
        ).to_pylist()[0]
    finally:
        store.close()
    return int(s["n"]), int(s["u"]), int(c["n"]), int(c["u"])


def play(ranks: int, seconds: int, workdir: str, relay: bool = False) -> dict[str, Any]:
    """One level: ``ranks`` SDK runs stepping once a second for ``seconds`` against a fresh
    server (through a relay per 8 ranks with ``relay``); its figures."""
    data = os.path.join(workdir, f"data-{ranks}")
    proc, url = start_server(data)
    run_id = f"load-{ranks}"
    slow_rank, slow_at = ranks // 3, seconds // 2
    latencies: list[float] = []
    runs = []
    relays: list[Relay] = []
    try:
        relays = _relays(ranks, url, workdir, latencies) if relay else []
        for r in range(ranks):
            transport = None
            if relays:
                addr = relays[r // 8].address
                assert addr is not None
                transport = HttpTransport(f"http://{addr[0]}:{addr[1]}")
            elif r % SAMPLE_EVERY == 0:
                transport = SampledTransport(url)
                transport.latencies = latencies
            runs.append(
                fleetlens.init(
                    project="load",
                    run_id=run_id,
                    job_id="a0",
                    server=url,
                    rank=r,
                    local_rank=r % 8,
                    world_size=ranks,
                    node_id=f"node-{r // 8:05d}",
                    gpu=r % 8,
                    spool_dir=os.path.join(workdir, f"spool-{ranks}", str(r)),
                    install_signal_handler=False,
                    transport=transport,
                )
            )
        found: list[int] = []
        step_now = [0]
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(1.0):
                if step_now[0] < slow_at:
                    continue
                for f in _stragglers(url, run_id):
                    if slow_rank in f.get("ranks", []):
                        found.append(step_now[0] - slow_at)
                        return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        cpu0, rss, lags = proc_cpu_s(proc.pid), [], []
        t0 = time.time() + 1.0
        for k in range(seconds):
            target = t0 + k
            time.sleep(max(0.0, target - time.time()))
            step_now[0] = k
            for r, run in enumerate(runs):
                slow = 1.15 if (r == slow_rank and k >= slow_at) else 1.0
                fwd, bwd, opt = 0.3 * slow, 0.45 * slow, 0.05 * slow
                comm = 0.22 - (fwd + bwd + opt - 0.8) if k >= slow_at else 0.1
                dur = 0.02 + fwd + bwd + opt + comm
                now = time.time()
                run.record_step(
                    k,
                    time=now - dur,
                    duration=dur,
                    tokens=4096,
                    phases={
                        "data": 0.02,
                        "forward": fwd,
                        "backward": bwd,
                        "optimizer": opt,
                        "comm": comm,
                    },
                )
                run.log(k, **SCALARS)
            lags.append(time.time() - target)
            if k % 5 == 0:
                rss.append(rss_mb(proc.pid))
        cpu = proc_cpu_s(proc.pid) - cpu0
        t_finish = time.monotonic()
        for run in runs:
            run.finish()
        for rel in relays:
            rel.stop(10.0)  # the relays forward what they hold, then stop
        finish_s = time.monotonic() - t_finish
        time.sleep(max(0.0, 6.0 - (time.monotonic() - t_finish)))  # a last monitoring pass
        for f in _stragglers(url, run_id) if not found else []:
            if slow_rank in f.get("ranks", []):
                found.append(seconds - slow_at)
        stop.set()
        stats = [run.stats() for run in runs]
        relay_stats = [rel.stats() for rel in relays]
    finally:
        for rel in relays:
            rel.stop(0.0)
        stop_server(proc)
    n_steps, u_steps, n_scalars, u_scalars = _stored(data, run_id, seconds)
    expected = ranks * seconds
    latencies.sort()
    half = len(rss) // 2
    flat = not rss or max(rss[half:] or rss) <= 1.15 * max(rss[: max(1, half)])
    out = {
        "ranks": ranks,
        "seconds": seconds,
        "ack_p50_s": round(latencies[len(latencies) // 2], 3) if latencies else None,
        "ack_p99_s": round(latencies[int(len(latencies) * 0.99)], 3) if latencies else None,
        "lost": (expected - u_steps) + (expected * len(SCALARS) - u_scalars),
        "duplicates": (n_steps - u_steps) + (n_scalars - u_scalars),
        "server_cpu_us_per_rank_step": round(cpu * 1e6 / expected, 1),
        "server_cpu_cores": round(cpu / seconds, 2),
        "server_rss_mb": round(max(rss or [0.0]), 1),
        "rss_flat": flat,
        "straggler_found_steps": found[0] if found else None,
        "driver_lag_p99_s": round(sorted(lags)[int(len(lags) * 0.99)], 3),
        "finish_s": round(finish_s, 2),
        "send_failures": sum(s.get("send_failures", 0) for s in stats),
        "spooled_batches": sum(s.get("spooled_batches", 0) for s in stats),
        "requests": sum(s.get("batches_sent", 0) for s in stats),
    }
    if relay:
        out["relays"] = len(relay_stats)
        out["relay_requests"] = sum(s["forward_requests"] for s in relay_stats)
        out["relay_send_failures"] = sum(s["send_failures"] for s in relay_stats)
        out["relay_refused"] = sum(s["refused"] + s["refused_full"] for s in relay_stats)
        out["relay_left_spooled"] = sum(s["spooled_batches"] for s in relay_stats)
        out["relay_interval_s"] = max(s["interval_s"] for s in relay_stats)
    out["held"] = bool(
        out["ack_p99_s"] is not None
        and out["ack_p99_s"] <= GOAL_ACK_P99_S
        and out["lost"] == 0
        and out["duplicates"] == 0
        and flat
        and out["straggler_found_steps"] is not None
        and out["straggler_found_steps"] <= GOAL_FOUND_STEPS
    )
    shutil.rmtree(data, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64 ranks, 10 s, direct and relayed (CI)")
    ap.add_argument("--ranks", default="", help="levels to try, e.g. 64,256,1024")
    ap.add_argument("--relay-ranks", default="", help="levels through relays, e.g. 512,2048")
    ap.add_argument("--seconds", type=int, default=0, help="stepping time per level")
    ap.add_argument("--mode", choices=("direct", "relay", "both"), default="both")
    args = ap.parse_args()
    levels = [int(x) for x in args.ranks.split(",") if x] or (
        [64] if args.quick else [128, 256, 512, 1024, 2048, 4096]
    )
    relay_levels = [int(x) for x in args.relay_ranks.split(",") if x] or (
        [64] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    )
    seconds = args.seconds or (10 if args.quick else 300)
    workdir = tempfile.mkdtemp(prefix="fl-fleet-load-")

    def climb(ns: list[int], relay: bool) -> list[dict[str, Any]]:
        out = []
        for n in ns:
            res = play(n, seconds, workdir, relay=relay)
            print(json.dumps({"relay": relay, **res}), file=sys.stderr, flush=True)
            out.append(res)
            if not res["held"]:
                break
        return out

    try:
        results = climb(levels, False) if args.mode != "relay" else []
        relayed = climb(relay_levels, True) if args.mode != "direct" else []
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    held = [r for r in results if r["held"]]
    held_relay = [r for r in relayed if r["held"]]
    best = (held or held_relay or results or relayed)[-1]
    everything = results + relayed
    emit(
        {
            "bench": "fleet_load",
            "quick": args.quick,
            "levels": results,
            "relay_levels": relayed,
            "max_ranks_direct": (held[-1]["ranks"] if held else 0) if results else None,
            "max_ranks_relay": (held_relay[-1]["ranks"] if held_relay else 0) if relayed else None,
            "ack_p99_s": best["ack_p99_s"],
            "lost": sum(r["lost"] for r in everything),
            "duplicates": sum(r["duplicates"] for r in everything),
            "server_cpu_us_per_rank_step": best["server_cpu_us_per_rank_step"],
            "server_rss_mb": best["server_rss_mb"],
            "straggler_found_steps": best["straggler_found_steps"],
            "goal_max_ranks_direct": 2048,
            "goal_max_ranks_relay": 16384,
            "ok": (bool(held) or not results)
            and (bool(held_relay) or not relayed)
            and all(r["lost"] == 0 and r["duplicates"] == 0 for r in everything),
        }
    )


if __name__ == "__main__":
    main()
