"""``fleetlens compare``, ``import``, ``lineage`` and ``models``: clients of the run graph API."""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from .cli import _get, _post, _server_url
from .errors import FleetlensError

__all__ = ["add_parsers", "cmd_compare", "cmd_import", "cmd_lineage", "cmd_models_register"]


def _f(v: Any, spec: str = ".4g") -> str:
    return "-" if v is None else format(v, spec)


def cmd_compare(args: argparse.Namespace) -> int:
    data = _get(args, "/v1/runs/compare", runs=",".join(args.runs))
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    runs = data["runs"]
    w = max(14, *(len(r) for r in runs))
    print(f"{'':<28}" + "".join(f"{r:>{w + 2}}" for r in runs))
    for d in data["config"]:
        mark = "  <- changed" if d["status"] == "changed" else f"  ({d['status']})"
        print(f"{d['key']:<28}" + "".join(f"{_v(x):>{w + 2}}" for x in d["values"]) + mark)
    for key, label in (("dataset", "dataset"), ("code", "code")):
        if data[key]["changed"]:
            print(f"{label:<28}" + "".join(f"{_v(x):>{w + 2}}" for x in data[key]["values"]))
    for key, label, spec in (
        ("stepTimeMedianSeconds", "step time (s)", ".4g"),
        ("tokensPerSecond", "tokens/s", ".4g"),
        ("mfu", "MFU", ".1%"),
        ("goodput", "goodput (productive share)", ".1%"),
        ("stragglerSpread", "straggler spread", ".1%"),
    ):
        print(f"{label:<28}" + "".join(f"{_f(s[key], spec):>{w + 2}}" for s in data["side"]))
    for metric, m in data["matchedSteps"].items():
        tail = m["tail"]
        print(
            f"{metric + ' (last tenth)':<28}" + "".join(f"{_f(tail.get(r)):>{w + 2}}" for r in runs)
        )
    print(
        f"{'health':<28}"
        + "".join(
            f"{(', '.join(s['health']['issues']) or 'healthy')[:w]:>{w + 2}}" for s in data["side"]
        )
    )
    for c in data["conclusions"]:
        print(f"\n{c['run']} vs {c['baseline']}: likely cause: {c['cause']}")
        for line in c["lines"]:
            print(f"  {line}")
    return 0


def _v(x: Any) -> str:
    return "-" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))


def cmd_import(args: argparse.Namespace) -> int:
    from .importers.runlog import batches
    from .traces.cli import post_batch

    if args.format == "megatron":
        from .importers.megatron import read_megatron as read
    elif args.format == "lightning":
        from .importers.lightning import read_lightning as read
    else:
        from .importers.hf_trainer import read_hf_trainer as read
    run_id = args.run
    token = os.environ.get("FLEETLENS_TOKEN")
    out: list[dict[str, Any]] = []
    for log in args.logs:
        run = read(log, start=args.start)
        summary = run.summary()
        rid = run_id if len(args.logs) == 1 else f"{run_id}-{len(out)}"
        summary["runId"] = rid
        if not args.dry_run:
            for _, body in batches(run, rid, args.project or ""):
                post_batch(_server_url(args), body, token)
        out.append(summary)
    print(json.dumps(out if len(out) > 1 else out[0], indent=2))
    return 0


def cmd_lineage(args: argparse.Namespace) -> int:
    if args.what == "run":
        data = _get(args, f"/v1/lineage/runs/{urllib.parse.quote(args.id, safe='')}")
    else:
        model, _, version = args.id.partition(":")
        if not version:
            raise FleetlensError(f"name the model version as MODEL:VERSION, not {args.id!r}")
        q = urllib.parse.quote
        data = _get(
            args,
            f"/v1/lineage/models/{q(model, safe='')}/{q(version, safe='')}",
            verify="true" if args.verify else None,
        )
    print(json.dumps(data, indent=2))
    return 0


def cmd_models_register(args: argparse.Namespace) -> int:
    model, _, version = args.model.partition(":")
    if not version:
        raise FleetlensError(f"name the model version as MODEL:VERSION, not {args.model!r}")
    body: dict[str, Any] = {"modelId": model, "version": version, "runId": args.run}
    if args.checkpoint:
        body["checkpointId"] = args.checkpoint
    if args.step is not None:
        body["step"] = args.step
    if args.evaluation:
        body["evaluationId"] = args.evaluation
    print(json.dumps(_post(args, "/v1/models", body), indent=2))
    return 0


def _client(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--server", help="server URL (default $FLEETLENS_SERVER or loopback)")


def add_parsers(sub: Any) -> None:
    """Add ``compare``, ``import``, ``lineage`` and ``models`` to the CLI's subparsers."""
    c = sub.add_parser("compare", help="compare runs: config diff, speed, health, a conclusion")
    c.add_argument(
        "runs", nargs="+", metavar="RUN", help="two or more runs; the first is the baseline"
    )
    c.add_argument("--json", action="store_true", help="print the API's JSON")
    _client(c)
    c.set_defaults(func=cmd_compare)

    imp = sub.add_parser("import", help="import a training log as a run")
    imp.add_argument("format", choices=("megatron", "lightning", "hf"))
    imp.add_argument("logs", nargs="+", metavar="LOG")
    imp.add_argument("--run", required=True, help="run id to store it under")
    imp.add_argument("--project", default="")
    imp.add_argument(
        "--start", type=float, default=1.7e9, help="UNIX start time for logs without a clock"
    )
    imp.add_argument("--dry-run", action="store_true", help="parse and summarise only")
    _client(imp)
    imp.set_defaults(func=cmd_import)

    ln = sub.add_parser("lineage", help="lineage of a run or a model version")
    ln.add_argument("what", choices=("run", "model"))
    ln.add_argument("id", help="RUN, or MODEL:VERSION")
    ln.add_argument("--verify", action="store_true", help="re-checksum checkpoint and dataset")
    _client(ln)
    ln.set_defaults(func=cmd_lineage)

    m = sub.add_parser("models", help="model versions")
    msub = m.add_subparsers(dest="models_command", required=True)
    reg = msub.add_parser("register", help="register MODEL:VERSION from a run's checkpoint")
    reg.add_argument("model", metavar="MODEL:VERSION")
    reg.add_argument("--run", required=True)
    reg.add_argument("--checkpoint", help="checkpoint id")
    reg.add_argument("--step", type=int, help="or the checkpoint's step")
    reg.add_argument("--evaluation", help="evaluation id, once evaluated")
    _client(reg)
    reg.set_defaults(func=cmd_models_register)
