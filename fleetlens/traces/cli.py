"""``fleetlens traces import PATH... --run RUN``: parse traces here, send the tables to a server.

Traces can be large, so they are parsed on the machine that has them and only the per-step and
per-collective tables travel (one gzip batch per rank, to ``{server}/v1/ingest``, with
``Authorization: Bearer $FLEETLENS_TOKEN`` when that is set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

from ..config import DEFAULT_PORT
from ..errors import FleetlensError
from .importer import RankTrace, batches, import_traces

__all__ = ["add_parser", "cmd_traces_import", "post_batch"]


def _server_url(args: argparse.Namespace) -> str:
    return str(
        args.server or os.environ.get("FLEETLENS_SERVER") or f"http://127.0.0.1:{DEFAULT_PORT}"
    ).rstrip("/")


def post_batch(server: str, body: bytes, token: str | None = None) -> dict[str, Any]:
    """POST one gzip msgpack batch to the collector; raise FleetlensError with its answer."""
    url = f"{server}/v1/ingest"
    req = urllib.request.Request(url, data=body, method="POST")
    req.add_header("Content-Type", "application/msgpack")
    req.add_header("Content-Encoding", "gzip")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return dict(json.load(resp))
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        raise FleetlensError(f"{url}: HTTP {exc.code}: {detail}") from exc
    except urllib.error.URLError as exc:
        raise FleetlensError(
            f"cannot reach the fleetlens server at {server} ({exc.reason}); "
            "start one with `fleetlens serve` or pass --server URL"
        ) from exc


def _f(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _print_row(s: dict[str, Any]) -> None:
    steps = f"{s['fromStep']}-{s['toStep']}" if s["steps"] else "-"
    print(
        f"{s['rank']:>5} {steps:>11} {_f(s['meanStepMs'], '.1f'):>9} "
        f"{_f(s['computePct'], '.1f'):>8} {_f(s['commPct'], '.1f'):>6} "
        f"{_f(s['exposedCommPct'], '.1f'):>8} {_f(s['overlapPct'], '.1f'):>8} "
        f"{_f(s['idlePct'], '.1f'):>6} {s['kernels']:>8} {s['collectives']:>6}  {s['file']}"
    )


def cmd_traces_import(args: argparse.Namespace) -> int:
    server = _server_url(args)
    token = os.environ.get("FLEETLENS_TOKEN")
    print(
        f"{'RANK':>5} {'STEPS':>11} {'STEP_MS':>9} {'COMPUTE%':>8} {'COMM%':>6} "
        f"{'EXPOSED%':>8} {'OVERLAP%':>8} {'IDLE%':>6} {'KERNELS':>8} {'COLLS':>6}  FILE"
    )
    summaries: list[dict[str, Any]] = []
    rt: RankTrace
    for rt in import_traces(args.paths):
        s = rt.summary()
        if s["clock"] == "trace":
            print(
                f"fleetlens: {s['file']}: no UNIX time base in the trace; times are the "
                "profiler's own clock in seconds",
                file=sys.stderr,
            )
        if not args.dry_run:
            _, body = batches(rt, args.run, args.job or "")
            post_batch(server, body, token)
        _print_row(s)
        summaries.append(s)
    if args.json:
        print(json.dumps({"run": args.run, "ranks": summaries}, indent=2))
    what = "parsed (dry run, nothing sent)" if args.dry_run else f"imported into {server}"
    print(f"{len(summaries)} rank trace(s) {what}, run {args.run}", file=sys.stderr)
    return 0


def add_parser(sub: Any) -> None:
    """Add ``traces import`` to the CLI's subcommands."""
    sp = sub.add_parser("traces", help="PyTorch profiler (Kineto) traces")
    tsub = sp.add_subparsers(dest="traces_command", required=True)
    imp = tsub.add_parser(
        "import",
        help="per-step compute / communication / idle per rank, and collectives, from traces",
    )
    imp.add_argument("paths", nargs="+", metavar="PATH", help="trace files or directories")
    imp.add_argument("--run", required=True, help="run id the traces belong to")
    imp.add_argument("--job", default=None, help="job (attempt) id")
    imp.add_argument("--server", default=None, help="server URL (env FLEETLENS_SERVER)")
    imp.add_argument("--dry-run", action="store_true", help="parse and summarise, send nothing")
    imp.add_argument("--json", action="store_true", help="also print the summary as JSON")
    imp.set_defaults(func=cmd_traces_import)
