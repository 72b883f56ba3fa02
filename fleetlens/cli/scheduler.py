"""``fleetlens import sacct|sinfo|k8s|alibaba FILE``: scheduler records into a server;
``fleetlens fleet allocations|capacity``: what was stored, read back.

The file travels as the scheduler printed it to ``POST /v1/scheduler/import``, which parses all
of it before storing any (a bad line is refused with its number, and nothing is stored).
``--dry-run`` parses it here and prints the same summary without a server. The commands that
make each file are in docs/goodput.md ("Scheduler records").
"""

from __future__ import annotations

import argparse
import contextlib
from datetime import datetime, timezone
from typing import Any

from ..errors import ConfigError
from ._common import client, client_opts
from ._output import Table, fmt, print_json

__all__ = [
    "FORMATS",
    "add_fleet_parsers",
    "add_options",
    "cmd_fleet_allocations",
    "cmd_fleet_capacity",
    "cmd_sched_import",
]

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
            args.format,
            body["data"],
            nodes=body.get("nodes"),
            pool=args.pool,
            run_id=args.run,
            tz=args.tz or "UTC",
            epoch=args.epoch or 0.0,
            time=args.time,
        )
        print_json({**summary(parsed), "stored": False})
        return 0
    with contextlib.ExitStack() as stack:
        c = stack.enter_context(client(args, timeout=300.0))
        print_json(c.post("/v1/scheduler/import", body))
    return 0


def add_options(imp: argparse.ArgumentParser) -> None:
    """The scheduler formats' options on ``fleetlens import``."""
    imp.add_argument(
        "--pool",
        help="k8s, alibaba, sacct: the pool the records belong to (k8s: `k8s`, "
        "alibaba: `openb`, sacct: each job's Partition)",
    )
    imp.add_argument("--tz", help="sacct: the cluster's time zone, e.g. Europe/Paris (UTC)")
    imp.add_argument(
        "--epoch", type=float, help="alibaba: UNIX time of the trace's second 0 (default 0)"
    )
    imp.add_argument("--nodes", help="alibaba: openb_node_list_gpu_node.csv, the pool's capacity")
    imp.add_argument("--time", type=float, help="sinfo: UNIX time it ran (default now)")


def _utc(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def cmd_fleet_allocations(args: argparse.Namespace) -> int:
    with client(args) as c:
        data = c.get(
            "/v1/scheduler/allocations",
            runId=args.run,
            jobId=args.job,
            pool=args.pool,
            limit=args.limit,
        )
    if args.json:
        print_json(data)
        return 0
    t = Table(
        ("POOL", "<12"),
        ("JOB", "<24"),
        ("GPUS", ">5"),
        ("SUBMIT (UTC)", "<19"),
        ("WAIT s", ">8"),
        ("GANG AFTER s", ">12"),
        ("HELD h", ">8"),
        ("STATE", ""),
    )
    print(t.header())
    for a in data["allocations"]:
        start, end = a["start"], a["end"]
        gang = (
            "never"
            if a["gangNeverComplete"]
            else (fmt(a["gangComplete"] - start, ".0f") if start is not None else None)
        )
        held = (end - start) / 3600 if start is not None and end is not None else None
        wait = fmt(a["queueWaitSeconds"], ".0f")
        print(
            t.row(
                a["pool"],
                a["jobId"],
                a["gpus"],
                _utc(a["submit"]),
                wait,
                gang,
                fmt(held, ".2f"),
                a["state"],
            )
        )
    s = data.get("scheduling")
    if s:
        print(f"run {args.run}: scheduling factor {s['factor']:.3f} ({s['basis']})")
    return 0


def cmd_fleet_capacity(args: argparse.Namespace) -> int:
    with client(args) as c:
        data = c.get("/v1/scheduler/capacity", pool=args.pool)
    if args.json:
        print_json(data)
        return 0
    t = Table(("POOL", "<16"), ("TIME (UTC)", "<19"), ("INSTALLED", ">9"), ("IN SERVICE", ">10"))
    print(t.header())
    for p in data["pools"]:
        print(t.row(p["pool"], _utc(p["time"]), p["capacityGpus"], p["inServiceGpus"]))
    return 0


def add_fleet_parsers(fsub: Any) -> None:
    """``fleet allocations`` and ``fleet capacity``: the imported records, read back."""
    al = fsub.add_parser("allocations", help="imported scheduler allocations per job")
    al.add_argument("--run", help="the run's allocations, and its scheduling factor")
    al.add_argument("--job", help="one scheduler job id")
    al.add_argument("--pool")
    al.add_argument("--limit", type=int, default=1000)
    client_opts(al)
    al.set_defaults(func=cmd_fleet_allocations)
    cp = fsub.add_parser("capacity", help="imported capacity per pool: installed, in service")
    cp.add_argument("--pool")
    client_opts(cp)
    cp.set_defaults(func=cmd_fleet_capacity)
