"""``fleetlens import FORMAT FILE...``: a training log as a run, or scheduler records.

One subcommand per format, each with its own ``--help`` and only its own options, and one output
convention for all: a summary a person reads (a table where there are rows), ``--json`` for the
JSON alone on stdout, the count and where it went on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import TYPE_CHECKING, Any

import msgspec

from . import scheduler
from ._common import client, client_opts
from ._output import fmt, print_json

if TYPE_CHECKING:
    from ..importers.runlog import RunLogSummary

__all__ = ["LOG_FORMATS", "add_parser", "cmd_import_log"]

LOG_FORMATS: dict[str, tuple[str, str]] = {
    "megatron": (
        "Megatron-LM / Megatron-DeepSpeed training logs (a launcher's or Slurm's .out file: "
        "iteration lines, the argument block, restarts, Slurm CANCELLED), or Megatron-LM CI "
        "golden values JSON",
        "megatron:read_megatron",
    ),
    "nemo": (
        "NeMo 2.0 progress lines (Training epoch E, iteration N/T | ...) or NeMo 1's progress "
        "bar; no clock: steps laid end to end from --start",
        "steplog:read_nemo",
    ),
    "torchtitan": (
        "torchtitan's metrics lines (step: N  loss: ...  tps: ...  mfu: ...%), their logging "
        "stamps as the clock",
        "steplog:read_torchtitan",
    ),
    "lightning": (
        "PyTorch Lightning CSVLogger metrics.csv (timing with a `time` column)",
        "lightning:read_lightning",
    ),
    "hf": (
        "Hugging Face Trainer trainer_state.json (mean step time from train_runtime)",
        "hf_trainer:read_hf_trainer",
    ),
}
"""The training-log formats: their help, and ``module:function`` of their reader under
:mod:`fleetlens.importers`."""


def _reader(fmt_name: str) -> Any:
    import importlib

    module, func = LOG_FORMATS[fmt_name][1].split(":")
    return getattr(importlib.import_module(f"fleetlens.importers.{module}"), func)


def cmd_import_log(args: argparse.Namespace) -> int:
    from ..importers.runlog import batches

    read = _reader(args.format)
    acc_name = ""
    if args.accelerator:
        from ..analysis.flops import accelerator

        # "h100", "NVIDIA H100 80GB HBM3"...: stored under the table's name; an unknown name
        # fails here, listing the known ones
        acc_name = accelerator(args.accelerator).name
    out: list[RunLogSummary] = []
    with contextlib.ExitStack() as stack:
        c = None if args.dry_run else stack.enter_context(client(args, timeout=120.0))
        for log in args.logs:
            run = read(log, start=args.start)
            if acc_name:
                run.config["accelerator"] = acc_name
            rid = args.run if len(args.logs) == 1 else f"{args.run}-{len(out)}"
            summary = msgspec.structs.replace(run.summary(), run_id=rid)
            if c is not None:
                for _, body in batches(run, rid, args.project or ""):
                    c.ingest(body, gzip=True)
            out.append(summary)
            if len(args.logs) > 1:  # progress over many logs, off stdout
                print(f"{len(out)}/{len(args.logs)} {log}", file=sys.stderr)
        where = f"imported into {c.server}" if c is not None else "parsed (dry run, nothing sent)"
    if args.json:
        print_json(msgspec.to_builtins(out if len(out) > 1 else out[0]))
    else:
        for summary in out:
            _print_log(summary)
    print(f"{len(out)} log(s) {where}", file=sys.stderr)
    return 0


def _print_log(s: RunLogSummary) -> None:
    """One imported log, as a person reads it (``--json``: the summary as it is)."""
    print(f"run {s.run_id}  ({s.source}, {s.file})")
    print(
        f"  steps {s.from_step}-{s.to_step} ({s.steps}), median step "
        f"{fmt(s.median_step_seconds, '.3f')} s, world size {fmt(s.world_size)}, "
        f"clock {s.clock}"
    )
    print(
        f"  attempts {len(s.attempts)} ({', '.join(map(str, s.attempts)) or '-'}), restarts "
        f"{s.restarts}, start-up {fmt(s.startup_seconds, '.1f')} s"
    )
    for e in s.events:
        print(f"  {e.kind} at step {e.step}: {e.message}"[:160])
    print(f"  slow periods: {len(s.slow_periods) or 'none'}")
    for p in s.slow_periods:
        print(f"    {msgspec.json.encode(p).decode()[:150]}")
    if s.non_finite:
        print(f"  non-finite values: {json.dumps(s.non_finite)}")
    print(f"  scalars: {', '.join(s.scalars) or '-'}")
    for note in s.notes:
        print(f"  note: {note}")


def _log_parser(isub: Any, name: str, aliases: tuple[str, ...] = ()) -> None:
    what = LOG_FORMATS[name][0]
    p = isub.add_parser(  # help is %-formatted by argparse, the description is not
        name, aliases=list(aliases), help=what.replace("%", "%%"), description=f"Import {what}."
    )
    p.add_argument("logs", nargs="+", metavar="LOG", help="log files (one run each)")
    p.add_argument(
        "--run", required=True, help="run id to store it under (RUN-0, RUN-1... for several logs)"
    )
    p.add_argument("--project", default="", help="project the run belongs to")
    p.add_argument(
        "--start", type=float, default=1.7e9, help="UNIX start time for logs without a clock"
    )
    p.add_argument(
        "--accelerator",
        default="",
        help="the GPU the job ran on (e.g. h100, 'NVIDIA A100-SXM4-80GB', V100-SXM2): with the "
        "model size and world size from the log's arguments it gives the run's MFU",
    )
    p.add_argument("--dry-run", action="store_true", help="parse and summarise, send nothing")
    client_opts(p)  # --json: the summary as JSON, alone on stdout
    p.set_defaults(func=cmd_import_log, format=name)


def add_parser(sub: Any) -> None:
    """Add ``import FORMAT`` to the CLI's subcommands: one per format."""
    imp = sub.add_parser(
        "import",
        help="import a training log as a run, or scheduler records (sacct, sinfo, k8s, alibaba)",
        description="Each format has its own options: fleetlens import FORMAT --help.",
    )
    isub = imp.add_subparsers(dest="format", required=True, metavar="FORMAT")
    for name in LOG_FORMATS:
        _log_parser(isub, name, ("hf-trainer",) if name == "hf" else ())
    scheduler.add_import_parsers(isub)
