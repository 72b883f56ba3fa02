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

import msgspec

from ..errors import ConfigError
from ._common import client, client_opts, decode, query
from ._output import Table, fmt, print_json

__all__ = [
    "FORMATS",
    "add_fleet_parsers",
    "add_import_parsers",
    "cmd_fleet_allocations",
    "cmd_fleet_capacity",
    "cmd_sched_import",
    "print_sched",
    "utc",
]

FORMATS = ("sacct", "sinfo", "k8s", "alibaba")
_CAPACITY = Table(
    ("POOL", "<16"), ("TIME (UTC)", "<19"), ("INSTALLED", ">9"), ("IN SERVICE", ">10")
)
"""A pool's GPUs at a time, as ``import sinfo`` and ``fleet capacity`` print them."""


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file ({what})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read as text ({exc})") from exc


def cmd_sched_import(args: argparse.Namespace) -> int:
    from ..api.scheduler import SchedulerImport

    body = SchedulerImport(
        format=args.format,
        data=_read(args.logs[0], args.format),
        run_id=args.run,
        pool=args.pool,
        tz=args.tz or "UTC",
        epoch=args.epoch or 0.0,
        nodes=_read(args.nodes, "the alibaba GPU node list") if args.nodes else None,
        time=args.time,
    )
    if args.dry_run:
        from ..api.scheduler_models import SchedulerImportOut
        from ..services.scheduler import parse_records, summary

        parsed = parse_records(
            args.format,
            body.data,
            nodes=body.nodes,
            pool=args.pool,
            run_id=args.run,
            tz=args.tz or "UTC",
            epoch=args.epoch or 0.0,
            time=args.time,
        )
        # the summary as the server answers it (POST /v1/scheduler/import with dryRun)
        done = SchedulerImportOut.of(summary(parsed)).model_dump(
            mode="json", by_alias=True, exclude_unset=True
        )
    else:
        with contextlib.ExitStack() as stack:
            c = stack.enter_context(client(args, timeout=300.0))
            done = c.post("/v1/scheduler/import", msgspec.to_builtins(body))
    if args.json:
        print_json(done)
    else:
        print_sched(done)
    return 0


def print_sched(doc: dict[str, Any]) -> None:
    """A scheduler file's summary, as a person reads it (``--json``: the summary as it is)."""
    from ..api.scheduler_models import SchedulerImportOut

    s = decode(SchedulerImportOut, doc)
    stored = "stored" if s.stored else "parsed (dry run, nothing stored)"
    print(f"{s.format}: {stored}")
    if s.started is not None:
        print(
            f"  allocations {s.allocations} ({s.started} started, {s.pending} "
            f"pending), {s.gpus} GPUs, pools {', '.join(s.pools or []) or '-'}"
        )
        if s.run_ids:
            print(f"  runs: {', '.join(s.run_ids)}")
        for reason, n in (s.pending_reasons or {}).items():
            print(f"  pending: {n} x {reason}")
    cap = s.capacity
    if cap:
        t = _CAPACITY
        print(t.header())
        for p in cap[:50]:
            print(t.row(p.pool, utc(p.time), p.capacity_gpus, p.in_service_gpus))
        if len(cap) > 50:
            print(f"  ... {len(cap) - 50} more capacity records (--json for all)")


_SCHED_HELP = {
    "sacct": "Slurm accounting (sacct --allocations --parsable2 --format=JobID,JobName,"
    "Partition,AllocTRES,Submit,Start,End,State,NNodes): allocations, queue waits, gang "
    "completion",
    "sinfo": "Slurm nodes (sinfo --Node --format='%N|%P|%T|%G'): each pool's installed and "
    "in-service GPUs at one time",
    "k8s": "Kubernetes pods and events (kubectl get pods,events -o json) that request GPUs: "
    "allocations",
    "alibaba": "Alibaba cluster-trace-gpu-v2023 openb pod list (with --nodes, its node list: "
    "the pool's capacity)",
}


def add_import_parsers(isub: Any) -> None:
    """``import sacct|sinfo|k8s|alibaba``: each with its own options and ``--help``."""
    for name in FORMATS:
        what = _SCHED_HELP[name]
        # help is %-formatted by argparse, the description is not
        p = isub.add_parser(name, help=what.replace("%", "%%"), description=f"Import {what}.")
        p.add_argument("logs", nargs=1, metavar="FILE", help="the file the command printed")
        if name != "sinfo":
            p.add_argument(
                "--run",
                help="the run the records belong to (its scheduling factor is computed from them)",
            )
        if name in ("sacct", "k8s", "alibaba"):
            default = {"sacct": "each job's Partition", "k8s": "k8s", "alibaba": "openb"}[name]
            p.add_argument("--pool", help=f"the pool the records belong to (default {default})")
        if name == "sacct":
            p.add_argument("--tz", help="the cluster's time zone, e.g. Europe/Paris (UTC)")
        if name == "alibaba":
            p.add_argument("--epoch", type=float, help="UNIX time of the trace's second 0 (0)")
            p.add_argument("--nodes", help="openb_node_list_gpu_node.csv, the pool's capacity")
        if name == "sinfo":
            p.add_argument("--time", type=float, help="UNIX time it ran (default now)")
        p.add_argument("--dry-run", action="store_true", help="parse and summarise, store nothing")
        client_opts(p)  # --json: the summary as JSON, alone on stdout
        unset = dict.fromkeys(("run", "pool", "tz", "epoch", "nodes", "time"))
        p.set_defaults(**unset, func=cmd_sched_import, format=name)


def utc(t: float | None) -> str:
    """A UNIX time as the tables print it (UTC), or "-"."""
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def cmd_fleet_allocations(args: argparse.Namespace) -> int:
    from ..api.scheduler_models import AllocationsOut

    with client(args) as c:
        doc = c.get(
            "/v1/scheduler/allocations",
            **query(run_id=args.run, job_id=args.job, pool=args.pool, limit=args.limit),
        )
    if args.json:
        print_json(doc)
        return 0
    data = decode(AllocationsOut, doc)
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
    for a in data.allocations:
        start, end = a.start, a.end
        done = a.gang_complete
        gang = (
            "never"
            if a.gang_never_complete
            else (fmt(done - start, ".0f") if start is not None and done is not None else None)
        )
        held = (end - start) / 3600 if start is not None and end is not None else None
        wait = fmt(a.queue_wait_seconds, ".0f")
        print(t.row(a.pool, a.job_id, a.gpus, utc(a.submit), wait, gang, fmt(held, ".2f"), a.state))
    s = data.scheduling
    if s is not None:
        print(f"run {args.run}: scheduling factor {s.factor:.3f} ({s.basis})")
    return 0


def cmd_fleet_capacity(args: argparse.Namespace) -> int:
    from ..api.scheduler_models import CapacityOut

    with client(args) as c:
        doc = c.get("/v1/scheduler/capacity", pool=args.pool)
    if args.json:
        print_json(doc)
        return 0
    t = _CAPACITY
    print(t.header())
    for p in decode(CapacityOut, doc).pools:
        print(t.row(p.pool, utc(p.time), p.capacity_gpus, p.in_service_gpus))
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
