"""``fleetlens traces import PATH... --run RUN``: parse traces here, send the tables to a server;
``fleetlens traces show RUN``: read them back (per rank, where the device time went).

Traces can be large, so they are parsed on the machine that has them and only the per-step and
per-collective tables travel (one gzip batch per rank, to ``{server}/v1/ingest``, with
``Authorization: Bearer`` ``--token`` or ``$FLEETLENS_TOKEN`` when one is given).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import FleetlensError
from ._common import client, client_opts, decode, query
from ._output import Table, fmt, print_json
from .captures import add_parsers as add_capture_parsers

if TYPE_CHECKING:
    from ..api.ops_models import TraceRankOut
    from ..traces.importer import TraceSummary

__all__ = ["add_parser", "cmd_traces_import", "cmd_traces_show"]

_SHARES = ("STEP_MS", "COMPUTE%", "COMM%", "EXPOSED%", "OVERLAP%", "MEMCPY%", "IDLE%")
"""Where a rank's step time went, as ``traces import`` and ``traces show`` print it: the same
columns, from the importer's summary (:meth:`RankTrace.summary`: the trace parsed on this
machine) and from the API's ranks (:func:`_shares`)."""


def _table(steps_width: int, last: tuple[str, str] | None = None) -> Table:
    cols = [("RANK", ">5"), ("STEPS", f">{steps_width}")]
    cols += [(name, f">{max(6, len(name))}") for name in _SHARES]
    cols += [("KERNELS", ">8"), ("COLLS", ">6")]
    return Table(*cols, *([last] if last else []))


def _shares(r: TraceSummary | TraceRankOut) -> list[str]:
    """A rank's :data:`_SHARES`, parsed here or answered by the server."""
    shares = (
        r.mean_step_ms,
        r.compute_pct,
        r.comm_pct,
        r.exposed_comm_pct,
        r.overlap_pct,
        r.memcpy_pct,
        r.idle_pct,
    )
    return [fmt(v, ".1f") for v in shares]


_TABLE = _table(11, (" FILE", ""))


def _row(s: TraceSummary) -> str:
    steps = f"{s.from_step}-{s.to_step}" if s.steps else "-"
    return _TABLE.row(s.rank, steps, *_shares(s), s.kernels, s.collectives, f" {s.file}")


def cmd_traces_import(args: argparse.Namespace) -> int:
    from ..traces.importer import RankTrace, batches, find_trace_files, import_traces

    files = find_trace_files(args.paths)  # a path with no trace is an error before any output
    summaries: list[TraceSummary] = []
    stepless: list[str] = []
    rt: RankTrace
    with contextlib.ExitStack() as stack:
        c = None if args.dry_run else stack.enter_context(client(args, timeout=120.0))
        for rt in import_traces(files):
            s = rt.summary()
            if not s.steps:
                # nothing to store: a run of it would have no step to show
                stepless.append(s.file)
                print(
                    f"fleetlens: {s.file}: no ProfilerStep# annotations (profile with "
                    "torch.profiler.schedule and call prof.step()); skipped",
                    file=sys.stderr,
                )
                continue
            if s.clock == "trace" and args.as_run:
                raise FleetlensError(
                    f"{s.file}: no UNIX time base in the trace, so its steps cannot be a "
                    "run's (--as-run); import it without --as-run"
                )
            if s.clock == "trace":
                print(
                    f"fleetlens: {s.file}: no UNIX time base in the trace; times are the "
                    "profiler's own clock in seconds",
                    file=sys.stderr,
                )
            if c is not None:
                job = args.job or ("a0" if args.as_run else "")
                start = None
                if args.as_run and not summaries:  # the first rank's batch starts the attempt
                    start = _job_start(rt, len(files))
                _, body = batches(rt, args.run, job, args.as_run, start)
                c.ingest(body, gzip=True)
                if args.upload_files:
                    _upload(c, args.run, rt)
            if not args.json:  # a row per rank as it is done: the table is the progress
                if not summaries:
                    print(_TABLE.header())
                print(_row(s), flush=True)
            else:  # stdout is the JSON's alone
                print(f"{len(summaries) + 1}/{len(files)} {s.file}", file=sys.stderr)
            summaries.append(s)
        where = f"imported into {c.server}" if c is not None else ""
    if not summaries:
        raise FleetlensError(
            f"no trace with profiler steps among {len(files)} file(s): nothing imported"
        )
    if args.json:
        ranks = msgspec.to_builtins(summaries)
        print_json({"run": args.run, "ranks": ranks, "skipped": stepless})
    what = where or "parsed (dry run, nothing sent)"
    print(f"{len(summaries)} rank trace(s) {what}, run {args.run}", file=sys.stderr)
    return 0


def _job_start(rt: Any, files: int) -> dict[str, Any]:
    """The attempt's job_start attributes from a rank's trace: the world it states (else the
    files imported) and the parallel layout its process groups give."""
    from ..analysis.layout import groups_config

    return {
        "config": groups_config(rt.groups),
        "world_size": rt.world_size or files,
        "imported_from": "kineto",
    }


def _upload(c: Any, run: str, rt: Any) -> None:
    """Send the rank's file itself (gzip-compressed, as the portal opens it in Perfetto)."""
    import gzip
    from pathlib import Path

    raw = Path(rt.path).read_bytes()
    body = raw if raw[:2] == b"\x1f\x8b" else gzip.compress(raw, compresslevel=6)
    c.request(
        "PUT",
        f"/v1/runs/{run}/traces/files/{rt.rank}",
        content=body,
        headers={"Content-Type": "application/gzip"},
        timeout=600.0,
    )


_SHOWN = _table(6)


def cmd_traces_show(args: argparse.Namespace) -> int:
    """The imported traces of a run: per rank over the window (every imported step by
    default), its mean step and where the device time went."""
    from ..api.ops_models import TracesOut

    # The table shows the ranks' totals: the per-step rows come with --json only.
    params = query(from_step=args.from_step, to_step=args.to_step)
    if not args.json:
        params["limit"] = 1
    with client(args) as c:
        doc = c.get(f"/v1/runs/{args.run}/traces", **params)
    if args.json:
        print_json(doc)
        return 0
    got = decode(TracesOut, doc)
    if not got.ranks:
        raise FleetlensError(
            f"run {args.run} has no imported trace (fleetlens traces import PATH --run {args.run})"
        )
    print(f"run {args.run}: steps {got.from_step}-{got.to_step}, {len(got.ranks)} rank(s)")
    print(_SHOWN.header())
    for r in got.ranks:
        print(_SHOWN.row(r.rank, r.steps, *_shares(r), r.kernels, r.collectives))
    if got.top_kernels:
        print("\nheaviest kernels (device time, every rank)")
        print(_KERNELS.header())
        for k in got.top_kernels:
            print(
                _KERNELS.row(
                    fmt(k.total_ms, ".1f"),
                    fmt(k.pct_of_step_time, ".1f"),
                    k.calls,
                    k.category,
                    f" {k.name[:100]}",
                )
            )
    if got.top_collectives:
        print("\nheaviest collectives (enter to exit, every rank)")
        print(_COLLS.header())
        for co in got.top_collectives:
            print(_COLLS.row(fmt(co.total_ms, ".1f"), co.calls, co.bytes, f" {co.op}"))
    return 0


_KERNELS = Table(
    ("TOTAL_MS", ">10"), ("STEP%", ">6"), ("CALLS", ">7"), ("KIND", "<8"), ("NAME", "")
)
_COLLS = Table(("TOTAL_MS", ">10"), ("CALLS", ">7"), ("BYTES", ">14"), ("OP", ""))


def add_parser(sub: Any) -> None:
    """Add ``traces import`` and ``traces show`` to the CLI's subcommands."""
    sp = sub.add_parser("traces", help="PyTorch profiler (Kineto) traces")
    tsub = sp.add_subparsers(dest="traces_command", required=True)
    imp = tsub.add_parser(
        "import",
        help="per-step compute / communication / idle per rank, and collectives, from traces",
    )
    imp.add_argument("paths", nargs="+", metavar="PATH", help="trace files or directories")
    imp.add_argument("--run", required=True, help="run id the traces belong to")
    imp.add_argument("--job", default=None, help="job (attempt) id")
    imp.add_argument("--dry-run", action="store_true", help="parse and summarise, send nothing")
    imp.add_argument(
        "--as-run",
        action="store_true",
        help="also store the profiled steps as the run's own, so it is analysed as a live run is "
        "(stragglers against their peers, stage imbalance, what-if); the layout comes from the "
        "traces' process groups",
    )
    imp.add_argument("--json", action="store_true", help="print the summary as JSON, no table")
    imp.add_argument(
        "--upload-files",
        action="store_true",
        help="also keep the trace files on the server (the portal opens them in Perfetto)",
    )
    client_opts(imp, json=False)
    imp.set_defaults(func=cmd_traces_import)
    show = tsub.add_parser("show", help="a run's imported traces, per rank: where the time went")
    show.add_argument("run", help="run id")
    show.add_argument("--from-step", type=int, default=None, help="first step (default: all)")
    show.add_argument("--to-step", type=int, default=None, help="last step (default: all)")
    client_opts(show)
    show.set_defaults(func=cmd_traces_show)
    add_capture_parsers(tsub)
