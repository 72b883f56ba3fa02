"""The agent loop: sample GPUs (NVML, or a local dcgm-exporter) and the host, send, repeat.

It sends through the SDK's exporter (:class:`fleetlens.sdk.recorder.Recorder`), so it has the
same guarantees as a training job's telemetry: a dead server never blocks it, samples spool to
disk and are replayed, and drops are counted. Beside it runs the node relay
(:mod:`fleetlens.agent.relay`, on ``127.0.0.1:7787`` unless told otherwise), which carries the
node's ranks' batches to the server.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import urllib.request
from typing import Any

from ..sdk.config import SDKConfig
from ..sdk.recorder import Recorder
from ..sdk.spool import default_spool_root
from .dcgm import parse_exposition
from .host import HostSampler
from .nvml import NvmlSampler, load_nvml
from .relay import DEFAULT_LISTEN, Relay, RelayConfig

__all__ = ["Agent", "add_parser", "main", "selftest"]


class Agent:
    def __init__(
        self,
        recorder: Recorder,
        node_id: str,
        *,
        nvml: Any = None,
        dcgm_url: str | None = None,
        proc_root: str = "/proc",
        sys_root: str = "/sys",
    ) -> None:
        self.recorder = recorder
        self.node_id = node_id
        self.dcgm_url = dcgm_url
        self.gpus = NvmlSampler(nvml, node_id) if nvml is not None else None
        self.host = HostSampler(node_id, proc_root, sys_root)
        self.errors = 0

    def _dcgm(self, now: float) -> list[dict[str, Any]]:
        assert self.dcgm_url is not None
        with urllib.request.urlopen(self.dcgm_url, timeout=5) as r:
            text = r.read().decode(errors="replace")
        return [g.sample(now) for g in parse_exposition(text, self.node_id)]

    def tick(self) -> int:
        """Take one round of samples; returns how many records were queued."""
        now = time.time()
        records: list[tuple[str, dict[str, Any]]] = [("node", self.host.sample(now))]
        try:
            if self.dcgm_url:
                records += [("gpu", s) for s in self._dcgm(now)]
            elif self.gpus is not None:
                records += [("gpu", s) for s in self.gpus.sample(now)]
        except Exception:  # a scrape that fails this round; the next one may not
            self.errors += 1
        for kind, values in records:
            self.recorder.sample(kind, **values)
        return len(records)

    def run(self, interval: float, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            self.tick()
            stop.wait(max(0.0, interval - (time.monotonic() - started)))


def selftest() -> int:
    """On a GPU host: load NVML for real, sample once, print what each GPU reported."""
    try:
        nvml = load_nvml()
    except Exception as exc:
        print(f"NVML is not usable here: {exc}", file=sys.stderr)
        return 1
    sampler = NvmlSampler(nvml, socket.gethostname())
    samples = sampler.sample(time.time())
    print(
        json.dumps(
            {
                "gpus": len(samples),
                "unsupported_queries": sampler.errors,
                "xid_events": sampler._events is not None,
                "samples": samples,
            },
            indent=2,
            default=str,
        )
    )
    return 0 if samples else 1


def start_relay(args: argparse.Namespace, server: str) -> Relay | None:
    """The node relay the flags ask for, started; None when off or its address is taken (the
    agent samples anyway: the ranks then send to the server directly)."""
    listen = "" if args.relay in ("", "off") else args.relay
    if not listen and not args.relay_socket:
        return None
    if listen and ":" not in listen:
        listen = f"127.0.0.1:{listen}"
    spool = args.relay_spool or os.path.join(default_spool_root(), "relay")
    cfg = RelayConfig(
        server=server,
        spool_dir=spool,
        listen=listen,
        socket_path=args.relay_socket or "",
        spool_max_bytes=args.relay_spool_bytes,
        interval=args.relay_interval,
    )
    try:
        relay = Relay(cfg).start()
    except (OSError, ValueError) as exc:
        where = " and ".join(x for x in (listen, args.relay_socket) if x)
        print(f"fleetlens agent: no relay on {where} ({exc}); ranks send directly", file=sys.stderr)
        return None
    print(
        f"fleetlens agent: relay on {relay.where()} -> {server}, spool {spool}",
        file=sys.stderr,
        flush=True,
    )
    return relay


def main(args: argparse.Namespace) -> int:
    if args.selftest:
        return selftest()
    logging.basicConfig(level=logging.WARNING, format="fleetlens agent: %(message)s")
    node = args.node or socket.gethostname()
    cfg = SDKConfig.resolve(
        {
            "server": args.server,
            "token": args.token,
            "node_id": node,
            "install_signal_handler": False,
            "relay": "off",  # the agent's own samples go straight to the server
        },
        os.environ,
    )
    stop = threading.Event()
    previous: Any = None
    if not args.once and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())  # stop cleanly
    relay = None if args.once else start_relay(args, cfg.server)
    recorder: Recorder | None = None
    try:
        if args.relay_only:
            stop.wait()
            return 0
        nvml = None
        if not args.dcgm_url and not args.no_gpu:
            try:
                nvml = load_nvml()
            except Exception as exc:
                print(f"fleetlens agent: no NVML ({exc}); sampling the host only", file=sys.stderr)
        recorder = Recorder(cfg)
        agent = Agent(recorder, node, nvml=nvml, dcgm_url=args.dcgm_url)
        if args.once:
            agent.tick()
        else:
            agent.run(args.interval, stop)
    except KeyboardInterrupt:
        pass
    finally:
        if recorder is not None:
            recorder.close(5.0)
        if relay is not None:
            relay.stop(5.0)
            print(f"fleetlens agent: relay stopped: {json.dumps(relay.stats())}", file=sys.stderr)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("agent", help="the node agent: GPU (NVML or dcgm-exporter) and host samples")
    p.add_argument("--server", help="collector URL (default $FLEETLENS_SERVER or loopback)")
    p.add_argument("--token", help="API token, role ingest (default $FLEETLENS_TOKEN)")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    p.add_argument(
        "--dcgm-url",
        help="scrape this dcgm-exporter instead of NVML, e.g. http://localhost:9400/metrics",
    )
    p.add_argument("--node", help="node id (default: host name)")
    p.add_argument("--no-gpu", action="store_true", help="host counters only")
    p.add_argument("--once", action="store_true", help="one round of samples, then exit")
    p.add_argument(
        "--relay",
        default=DEFAULT_LISTEN,
        help="node relay for the ranks: [HOST:]PORT on loopback, or off "
        f"(default {DEFAULT_LISTEN})",
    )
    p.add_argument("--relay-socket", help="also take the ranks' batches on this unix socket")
    p.add_argument(
        "--relay-spool",
        help="the relay's spool directory (default: the user's fleetlens spool root, /relay)",
    )
    p.add_argument(
        "--relay-spool-bytes",
        type=int,
        default=RelayConfig.spool_max_bytes,
        help="spool size limit (default 1 GiB)",
    )
    p.add_argument(
        "--relay-interval",
        type=float,
        default=RelayConfig.interval,
        help="shortest interval between forwards to the server, seconds (default 0.5)",
    )
    p.add_argument("--relay-only", action="store_true", help="relay only; sample nothing")
    p.add_argument(
        "--selftest",
        action="store_true",
        help="sample NVML once for real and print it (on a GPU host)",
    )
    p.set_defaults(func=main)
