"""``fleetlens serve``, ``fleetlens demo`` and ``fleetlens config``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..config import DEFAULT_PORT
from ..errors import FleetlensError
from ._common import exit_past_engine, server_config, server_opts

__all__ = ["add_config", "add_demo", "add_serve", "cmd_config", "cmd_demo", "cmd_serve"]


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ..api.http_protocol import timed_protocol
    from ..server import create_app, settle_heap

    cfg = server_config(args)
    print(
        f"fleetlens serving on http://{cfg.host}:{cfg.port}  data: {cfg.data_dir}  "
        f"API docs: http://{cfg.host}:{cfg.port}/docs",
        file=sys.stderr,
        flush=True,
    )
    app = create_app(cfg)
    settle_heap()
    uvicorn.run(
        app,
        host=cfg.host,
        port=cfg.port,
        log_level=cfg.log_level,
        http=timed_protocol(cfg.collector.header_timeout_s),
    )
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    resolved = server_config(args).as_dict()
    if args.json:
        print(json.dumps(resolved, indent=2))
        return 0
    # TOML, as a config file takes it: the [server] table, then one table per section.
    tables = {"server": {k: v for k, v in resolved.items() if not isinstance(v, dict)}}
    tables.update({k: v for k, v in resolved.items() if isinstance(v, dict)})
    for i, (name, table) in enumerate(tables.items()):
        print(("\n" if i else "") + f"[{name}]")
        for key, value in table.items():
            print(f"{key} = {json.dumps(value)}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    try:
        code = run_demo(
            data=args.data,
            port=args.port,
            scenario=args.scenario,
            speed=args.speed,
            once=args.once,
            ddp=args.ddp,
        )
    except KeyboardInterrupt:  # a second Ctrl-C while the server was stopping
        code = 130
    except FleetlensError as exc:
        print(f"fleetlens: {exc}", file=sys.stderr)
        code = 2
    # The demo ran the embedded engine in this process: its server is stopped and its stores
    # are closed, so leave without the engine's exit-time teardown (exit_past_engine says why).
    exit_past_engine(code)


def add_serve(sub: Any) -> None:
    sp = sub.add_parser("serve", help="run the collector and API server")
    server_opts(sp)
    sp.add_argument(
        "--auth",
        choices=("auto", "required", "off"),
        help="tokens: auto = required unless bound to loopback (default)",
    )
    sp.add_argument(
        "--readable-paths",
        help="directories (':'-separated) besides DATA/artifacts whose files the server may "
        "read to checksum artifacts and drained jobs' checkpoints (a shared file system)",
    )
    sp.add_argument(
        "--advertise-url",
        help="how the other servers sharing this PostgreSQL reach this one (default "
        "http://HOST:PORT); followers forward a job's control polls to the leader there",
    )
    sp.add_argument("--alertmanager-url", help="send alerts to this Alertmanager (API v2)")
    sp.add_argument("--webhook-url", help="send alerts to this JSON webhook")
    sp.add_argument("--slack-url", help="send alerts to this Slack-compatible webhook")
    sp.add_argument("--alert-policy", help="YAML file of alert policy overrides")
    sp.add_argument("--public-url", help="how users reach this server (links in alerts)")
    sp.add_argument(
        "--remediation",
        choices=("off", "recommend", "approve", "automatic"),
        help="what to do when a finding justifies taking a node out (default recommend)",
    )
    sp.add_argument(
        "--actuators", help="who takes a node out: torchrun, slurm, kubernetes (comma-separated)"
    )
    sp.set_defaults(func=cmd_serve)


def add_demo(sub: Any) -> None:
    p = sub.add_parser("demo", help="embedded server + a simulated run with faults + a summary")
    p.add_argument("--data", help="data directory (default ~/.local/share/fleetlens)")
    p.add_argument("--port", type=int, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--scenario", default="demo", help="a shipped scenario name or a YAML path")
    p.add_argument(
        "--speed",
        type=float,
        default=0.0,
        help="simulated seconds per wall second (0 = as fast as possible)",
    )
    p.add_argument("--once", action="store_true", help="exit after the summary")
    p.add_argument(
        "--no-ddp",
        dest="ddp",
        action="store_false",
        help="skip the real 4-process DDP run (it needs torch)",
    )
    p.set_defaults(func=cmd_demo)


def add_config(sub: Any) -> None:
    sp = sub.add_parser(
        "config", help="print the resolved server configuration (CLI > env > file > default)"
    )
    sp.add_argument("action", nargs="?", choices=("show",), default="show")
    server_opts(sp)
    sp.add_argument("--json", action="store_true", help="print it as JSON")
    sp.set_defaults(func=cmd_config)
