"""``fleetlens compare``, ``import``, ``lineage`` and ``models``: the run graph."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import urllib.parse
from typing import Any

from ..errors import FleetlensError
from . import scheduler
from ._common import client, client_opts
from ._output import fmt, print_json, value

__all__ = ["add_parsers", "cmd_compare", "cmd_import", "cmd_lineage", "cmd_models_register"]


def cmd_compare(args: argparse.Namespace) -> int:
    with client(args) as c:
        data = c.get("/v1/runs/compare", runs=",".join(args.runs))
    if args.json:
        print_json(data)
        return 0
    runs = data["runs"]
    w = max(14, *(len(r) for r in runs))

    def line(label: str, cells: list[str]) -> str:
        return f"{label:<28}" + "".join(f"{cell:>{w + 2}}" for cell in cells)

    print(line("", runs))
    for d in data["config"]:
        mark = "  <- changed" if d["status"] == "changed" else f"  ({d['status']})"
        print(line(d["key"], [value(x) for x in d["values"]]) + mark)
    for key in ("dataset", "code"):
        if data[key]["changed"]:
            print(line(key, [value(x) for x in data[key]["values"]]))
    for key, label, spec in (
        ("stepTimeMedianSeconds", "step time (s)", ".4g"),
        ("tokensPerSecond", "tokens/s", ".4g"),
        ("mfu", "MFU", ".1%"),
        ("goodput", "goodput (job)", ".1%"),
        ("runtimeGoodput", "runtime goodput", ".1%"),
        ("stragglerSpread", "straggler spread", ".1%"),
    ):
        print(line(label, [fmt(s.get(key), spec) for s in data["side"]]))
    for metric, m in data["matchedSteps"].items():
        tail = m["tail"]
        print(line(metric + " (last tenth)", [fmt(tail.get(r), ".4g") for r in runs]))
    evals = data.get("evaluations")
    if evals:
        ids = [(e or {}).get("evaluationId") or "-" for e in evals["byRun"]]
        print(line("evaluation", ids))
        for metric, m in evals["metrics"].items():
            cells = [
                fmt(v, ".4g") + ("" if d is None or i == 0 else f" ({d:+.3g})")
                for i, (v, d) in enumerate(zip(m["values"], m["deltas"], strict=True))
            ]
            print(line(metric, cells))
    health = [(", ".join(s["health"]["issues"]) or "healthy")[:w] for s in data["side"]]
    print(line("health", health))
    for c in data["conclusions"]:
        print(f"\n{c['run']} vs {c['baseline']}: likely cause: {c['cause']}")
        for text in c["lines"]:
            print(f"  {text}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    if args.format in scheduler.FORMATS:
        return scheduler.cmd_sched_import(args)
    from ..importers.runlog import batches

    if not args.run:
        raise FleetlensError(f"`import {args.format}` needs --run, the run id to store it under")
    if args.format == "megatron":
        from ..importers.megatron import read_megatron as read
    elif args.format == "lightning":
        from ..importers.lightning import read_lightning as read
    elif args.format == "nemo":
        from ..importers.steplog import read_nemo as read
    elif args.format == "torchtitan":
        from ..importers.steplog import read_torchtitan as read
    else:
        from ..importers.hf_trainer import read_hf_trainer as read
    acc_name = ""
    if args.accelerator:
        from ..analysis.flops import accelerator

        # "h100", "NVIDIA H100 80GB HBM3"...: stored under the table's name; an unknown name
        # fails here, listing the known ones
        acc_name = accelerator(args.accelerator).name
    out: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        c = None if args.dry_run else stack.enter_context(client(args, timeout=120.0))
        for log in args.logs:
            run = read(log, start=args.start)
            if acc_name:
                run.config["accelerator"] = acc_name
            summary = run.summary()
            rid = args.run if len(args.logs) == 1 else f"{args.run}-{len(out)}"
            summary["runId"] = rid
            if c is not None:
                for _, body in batches(run, rid, args.project or ""):
                    c.ingest(body, gzip=True)
            out.append(summary)
        where = f"imported into {c.server}" if c is not None else "parsed (dry run, nothing sent)"
    if args.json:
        print_json(out if len(out) > 1 else out[0])
        return 0
    for summary in out:
        _print_log(summary)
    print(f"{len(out)} log(s) {where}", file=sys.stderr)
    return 0


def _print_log(s: dict[str, Any]) -> None:
    """One imported log, as a person reads it (``--json``: the summary as it is)."""
    attempts = s.get("attempts") or []
    print(f"run {s['runId']}  ({s['source']}, {s['file']})")
    print(
        f"  steps {s['fromStep']}-{s['toStep']} ({s['steps']}), median step "
        f"{fmt(s.get('medianStepSeconds'), '.3f')} s, world size {fmt(s.get('worldSize'))}, "
        f"clock {s.get('clock', '-')}"
    )
    print(
        f"  attempts {len(attempts)} ({', '.join(map(str, attempts)) or '-'}), restarts "
        f"{s.get('restarts', 0)}, start-up {fmt(s.get('startupSeconds'), '.1f')} s"
    )
    for e in s.get("events") or []:
        print(f"  {e['kind']} at step {e.get('step', '-')}: {e.get('message', '')}"[:160])
    slow = s.get("slowPeriods") or []
    print(f"  slow periods: {len(slow) or 'none'}")
    for p in slow:
        print(f"    {json.dumps(p)[:150]}")
    if s.get("nonFinite"):
        print(f"  non-finite values: {json.dumps(s['nonFinite'])}")
    print(f"  scalars: {', '.join(s.get('scalars') or []) or '-'}")
    for note in s.get("notes") or []:
        print(f"  note: {note}")


def _model_version(text: str) -> tuple[str, str]:
    model, _, version = text.partition(":")
    if not version:
        raise FleetlensError(f"name the model version as MODEL:VERSION, not {text!r}")
    return model, version


def cmd_lineage(args: argparse.Namespace) -> int:
    q = urllib.parse.quote
    with client(args) as c:
        if args.what == "run":
            data = c.get(f"/v1/lineage/runs/{q(args.id, safe='')}")
        else:
            model, version = _model_version(args.id)
            data = c.get(
                f"/v1/lineage/models/{q(model, safe='')}/{q(version, safe='')}",
                verify="true" if args.verify else None,
            )
    print_json(data)
    return 0


def cmd_models_register(args: argparse.Namespace) -> int:
    model, version = _model_version(args.model)
    body: dict[str, Any] = {"modelId": model, "version": version, "runId": args.run}
    if args.checkpoint:
        body["checkpointId"] = args.checkpoint
    if args.step is not None:
        body["step"] = args.step
    if args.evaluation:
        body["evaluationId"] = args.evaluation
    with client(args) as c:
        print_json(c.post("/v1/models", body))
    return 0


def add_parsers(sub: Any) -> None:
    """Add ``compare``, ``import``, ``lineage`` and ``models`` to the CLI's subparsers."""
    c = sub.add_parser("compare", help="compare runs: config diff, speed, health, a conclusion")
    c.add_argument(
        "runs", nargs="+", metavar="RUN", help="two or more runs; the first is the baseline"
    )
    client_opts(c)
    c.set_defaults(func=cmd_compare)

    imp = sub.add_parser(
        "import",
        help="import a training log as a run, or scheduler records (sacct, sinfo, k8s, alibaba)",
    )
    imp.add_argument(
        "format",
        choices=(
            "megatron",
            "nemo",
            "torchtitan",
            "lightning",
            "hf",
            "hf-trainer",
            *scheduler.FORMATS,
        ),
    )
    imp.add_argument("logs", nargs="+", metavar="FILE", help="training logs, or one scheduler file")
    imp.add_argument(
        "--run",
        help="run id to store a log under (required for logs); for scheduler records, the run "
        "they belong to (its scheduling factor is computed from them)",
    )
    imp.add_argument("--project", default="")
    imp.add_argument(
        "--start", type=float, default=1.7e9, help="UNIX start time for logs without a clock"
    )
    imp.add_argument(
        "--accelerator",
        default="",
        help="the GPU the job ran on (e.g. h100, 'NVIDIA A100-SXM4-80GB', V100-SXM2): with the "
        "model size and world size from the log's arguments it gives the run's MFU",
    )
    imp.add_argument("--dry-run", action="store_true", help="parse and summarise only")
    scheduler.add_options(imp)
    client_opts(imp)  # --json: a log's summary as JSON (scheduler records always print it)
    imp.set_defaults(func=cmd_import)

    ln = sub.add_parser("lineage", help="lineage of a run or a model version")
    ln.add_argument("what", choices=("run", "model"))
    ln.add_argument("id", help="RUN, or MODEL:VERSION")
    ln.add_argument("--verify", action="store_true", help="re-checksum checkpoint and dataset")
    client_opts(ln)  # --json is accepted for uniformity: lineage always prints the JSON
    ln.set_defaults(func=cmd_lineage)

    m = sub.add_parser("models", help="model versions")
    msub = m.add_subparsers(dest="models_command", required=True)
    reg = msub.add_parser("register", help="register MODEL:VERSION from a run's checkpoint")
    reg.add_argument("model", metavar="MODEL:VERSION")
    reg.add_argument("--run", required=True)
    reg.add_argument("--checkpoint", help="checkpoint id")
    reg.add_argument("--step", type=int, help="or the checkpoint's step")
    reg.add_argument("--evaluation", help="evaluation id, once evaluated")
    client_opts(reg, json=False)
    reg.set_defaults(func=cmd_models_register)
