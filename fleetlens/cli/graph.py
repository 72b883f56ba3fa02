"""``fleetlens compare``, ``lineage`` and ``models``: the run graph."""

from __future__ import annotations

import argparse
import urllib.parse
from typing import Any

from ..errors import FleetlensError
from ._common import client, client_opts, decode
from ._output import fmt, print_json, value

__all__ = ["add_parsers", "cmd_compare", "cmd_lineage", "cmd_models_register"]


def cmd_compare(args: argparse.Namespace) -> int:
    from ..api.graph_models import CompareOut

    with client(args) as c:
        doc = c.get("/v1/runs/compare", runs=",".join(args.runs))
    if args.json:
        print_json(doc)
        return 0
    data = decode(CompareOut, doc)
    runs = data.runs
    w = max(14, *(len(r) for r in runs))

    def line(label: str, cells: list[str]) -> str:
        return f"{label:<28}" + "".join(f"{cell:>{w + 2}}" for cell in cells)

    print(line("", runs))
    for d in data.config:
        mark = "  <- changed" if d.status == "changed" else f"  ({d.status})"
        print(line(d.key, [value(x) for x in d.values]) + mark)
    for key, changed in (("dataset", data.dataset), ("code", data.code)):
        if changed.changed:
            print(line(key, [value(x) for x in changed.values]))
    if data.contract.changed:  # what differs of the software and the topology
        print(
            line(
                "measured on",
                ["(baseline)", *("; ".join(d) or "same" for d in data.contract.differences)],
            )
        )
    for key, label, spec in (
        ("step_time_median_seconds", "step time (s)", ".4g"),
        ("tokens_per_second", "tokens/s", ".4g"),
        ("mfu", "MFU", ".1%"),
        ("goodput", "goodput (job)", ".1%"),
        ("runtime_goodput", "runtime goodput", ".1%"),
        ("straggler_spread", "straggler spread", ".1%"),
    ):
        print(line(label, [fmt(getattr(s, key), spec) for s in data.side]))
    for metric, m in data.matched_steps.items():
        print(line(metric + " (last tenth)", [fmt(m.tail.get(r), ".4g") for r in runs]))
    evals = data.evaluations
    if evals:
        ids = [(e.evaluation_id if e is not None else "") or "-" for e in evals.by_run]
        print(line("evaluation", ids))
        for metric, md in evals.metrics.items():
            cells = [
                fmt(v, ".4g") + ("" if d is None or i == 0 else f" ({d:+.3g})")
                for i, (v, d) in enumerate(zip(md.values, md.deltas, strict=True))
            ]
            print(line(metric, cells))
    health = [(", ".join(s.health.issues) or "healthy")[:w] for s in data.side]
    print(line("health", health))
    for con in data.conclusions:
        print(f"\n{con.run} vs {con.baseline}: likely cause: {con.cause}")
        for text in con.lines:
            print(f"  {text}")
    return 0


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
    from ..api.graph_registration import ModelBody

    body = ModelBody.model_construct(  # the server validates it
        modelId=model,
        version=version,
        runId=args.run,
        checkpointId=args.checkpoint or None,
        step=args.step,
        evaluationId=args.evaluation or None,
    )
    with client(args) as c:
        print_json(c.post("/v1/models", body.model_dump(exclude_none=True)))
    return 0


def add_parsers(sub: Any) -> None:
    """Add ``compare``, ``lineage`` and ``models`` to the CLI's subparsers."""
    c = sub.add_parser("compare", help="compare runs: config diff, speed, health, a conclusion")
    c.add_argument(
        "runs", nargs="+", metavar="RUN", help="two or more runs; the first is the baseline"
    )
    client_opts(c)
    c.set_defaults(func=cmd_compare)

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
