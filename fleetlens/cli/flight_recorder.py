"""``fleetlens fr import DIR|FILE... --run RUN``: a hung job's NCCL Flight Recorder dumps.

The files travel as PyTorch wrote them (pickle or JSON) to ``POST /v1/runs/{run}/flight-recorder``;
the server reads them (refusing any pickle that names a class or function), names the stuck
collectives and the ranks missing from them, and stores each as a ``hang`` finding of the run.
A directory sends every file in it whose name ends in a rank number (``nccl_trace_rank_12``,
``_dump_12.json``); other files there (a README, the analyzer's output) are skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..analysis.flight_recorder import rank_from_name
from ..errors import ConfigError
from ._common import client, client_opts, decode
from ._output import print_json

__all__ = ["add_parser", "cmd_fr_import", "dump_paths"]


def dump_paths(paths: list[str]) -> list[str]:
    """The files to send: each FILE as given, and each DIR's files that end in a rank."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            found = sorted(
                (
                    os.path.join(p, n)
                    for n in os.listdir(p)
                    if os.path.isfile(os.path.join(p, n)) and rank_from_name(n) is not None
                ),
                key=lambda f: rank_from_name(f) or 0,
            )
            if not found:
                raise ConfigError(f"{p}: no dump files in it (names ending in the rank number)")
            out += found
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise ConfigError(f"{p}: no such file or directory")
    return out


def cmd_fr_import(args: argparse.Namespace) -> int:
    from ..api.ops_models import FlightRecorderImportOut

    files = dump_paths(args.paths)
    with client(args, timeout=300.0) as c:
        doc = c.flight_recorder(args.run, files, job_id=args.job)
    if args.json:
        print_json(doc)
        return 0
    out = decode(FlightRecorderImportOut, doc)
    print(f"run {out.run_id} job {out.job_id or '-'}: {len(files)} dump(s), world {out.world}")
    if not out.stuck:
        print("no stuck collective: every rank reached the same collective in every group")
    for s in out.stuck:
        name = f"{s.desc} ({s.group})" if s.desc else s.group
        print(
            f"stuck: {s.op or 'collective'} #{s.seq} in {name}; "
            f"missing ranks {','.join(map(str, s.missing))}"
        )
    for m in out.missing:
        where = f"{m.node} GPU {m.gpu if m.gpu is not None else '?'}" if m.node else ""
        print(f"  rank {m.rank}: {where or 'placement unknown'}")
    print(f"{len(out.findings)} finding(s) stored on run {out.run_id}", file=sys.stderr)
    return 0


def add_parser(sub: Any) -> None:
    """Add ``fr import`` to the CLI's subcommands."""
    sp = sub.add_parser("fr", help="PyTorch NCCL Flight Recorder dumps of a hung job")
    fsub = sp.add_subparsers(dest="fr_command", required=True)
    imp = fsub.add_parser(
        "import", help="stuck collectives and missing ranks from a job's dumps, as findings"
    )
    imp.add_argument("paths", nargs="+", metavar="DIR|FILE", help="dump files or directories")
    imp.add_argument("--run", required=True, help="run id the job belongs to")
    imp.add_argument("--job", default=None, help="job (attempt) id (default: the run's latest)")
    client_opts(imp)
    imp.set_defaults(func=cmd_fr_import)
