"""``fleetlens import sacct|sinfo|k8s|alibaba FILE``: scheduler records into a server.

The file travels as the scheduler printed it to ``POST /v1/scheduler/import``, which parses all
of it before storing any (a bad line is refused with its number, and nothing is stored).
``--dry-run`` parses it here and prints the same summary without a server. The commands that
make each file are in docs/goodput.md ("Scheduler records").
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from ..errors import ConfigError
from ._common import client
from ._output import print_json

__all__ = ["FORMATS", "add_options", "cmd_sched_import"]

FORMATS = ("sacct", "sinfo", "k8s", "alibaba")


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file ({what})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read as text ({exc})") from exc


def cmd_sched_import(args: argparse.Namespace) -> int:
    if len(args.logs) != 1:
        raise ConfigError(f"`import {args.format}` takes one FILE, not {len(args.logs)}")
    if args.nodes and args.format != "alibaba":
        raise ConfigError("--nodes (the GPU node list) goes with `import alibaba` only")
    body: dict[str, Any] = {"format": args.format, "data": _read(args.logs[0], args.format)}
    for key, value in (
        ("runId", args.run),
        ("pool", args.pool),
        ("tz", args.tz),
        ("epoch", args.epoch),
        ("time", args.time),
    ):
        if value is not None:
            body[key] = value
    if args.nodes:
        body["nodes"] = _read(args.nodes, "the alibaba GPU node list")
    if args.dry_run:
        from ..services.scheduler import parse_records, summary

        parsed = parse_records(
            args.format, body["data"], nodes=body.get("nodes"), pool=args.pool, run_id=args.run,
            tz=args.tz or "UTC", epoch=args.epoch or 0.0, time=args.time,
        )  # fmt: skip
        print_json({**summary(parsed), "stored": False})
        return 0
    with contextlib.ExitStack() as stack:
        c = stack.enter_context(client(args, timeout=300.0))
        print_json(c.post("/v1/scheduler/import", body))
    return 0


def add_options(imp: argparse.ArgumentParser) -> None:
    """The scheduler formats' options on ``fleetlens import``."""
    imp.add_argument(
        "--pool", help="k8s, alibaba, sacct: the pool the records belong to (k8s: `k8s`, "
        "alibaba: `openb`, sacct: each job's Partition)"
    )  # fmt: skip
    imp.add_argument("--tz", help="sacct: the cluster's time zone, e.g. Europe/Paris (UTC)")
    imp.add_argument(
        "--epoch", type=float, help="alibaba: UNIX time of the trace's second 0 (default 0)"
    )
    imp.add_argument("--nodes", help="alibaba: openb_node_list_gpu_node.csv, the pool's capacity")
    imp.add_argument("--time", type=float, help="sinfo: UNIX time it ran (default now)")
