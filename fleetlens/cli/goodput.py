"""``fleetlens goodput RUN`` and ``fleetlens fleet goodput``."""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from . import scheduler
from ._common import client, client_opts, decode
from ._output import Table, fmt, pct, print_json
from .goodput_answers import (
    add_options,
    parse_ceilings,
    parse_what_if,
    print_answers,
    print_what_if,
)

__all__ = ["add_parsers", "cmd_fleet_goodput", "cmd_goodput"]


class _WithWhatIf(msgspec.Struct, rename="camel"):
    """What ``goodput --what-if --json`` adds to the run's goodput: the what-if's answer."""

    what_if: dict[str, Any]


def cmd_goodput(args: argparse.Namespace) -> int:
    from ..api.goodput_models import RunGoodputOut, WhatIfOut

    ceilings = parse_ceilings(args.ceiling)
    with client(args) as c:
        data = c.goodput(
            args.run,
            price=args.price,
            scheduling=args.scheduling,
            accelerator=args.accelerator,
            dtype=args.dtype,
            ceilings=ceilings or None,
        )
        gp = decode(RunGoodputOut, data) if args.what_if or not args.json else None
        what_if: dict[str, Any] | None = None
        if args.what_if and gp is not None:
            change = parse_what_if(args.what_if, gp.breakdown.measured_terms)
            change.update(scheduling=gp.factors.scheduling)
            change.update(accelerator=args.accelerator, dtype=args.dtype)
            what_if = c.whatif(args.run, {k: v for k, v in change.items() if v is not None})
            data.update(msgspec.to_builtins(_WithWhatIf(what_if)))  # --json prints both
    if args.json or gp is None:
        print_json(data)
        return 0
    bd, f = gp.breakdown, gp.factors
    print(
        f"run {gp.run_id}  wall {bd.wall_seconds / 3600:.2f} h  held "
        f"{bd.held_seconds / 3600:.2f} h  attempts {bd.attempts}"
    )
    t = Table(("LINE", "<12"), ("HOURS", ">10"), ("SHARE", ">7"), (" FACTOR", ""), indent="  ")
    print(t.header())
    for line in bd.lines:
        if line.seconds <= 0 and line.category != "unaccounted":
            continue
        print(
            t.row(line.category, f"{line.seconds / 3600:.3f}", pct(line.share), f" {line.factor}")
        )
    if bd.instrumentation_hole:
        print(f"  ! unaccounted {pct(bd.unaccounted_share)} of wall-clock: instrumentation hole")
    print(
        f"  runtime {fmt(f.runtime, '.3f')}  program {fmt(f.program, '.3f')} "
        f"({gp.program.program_basis})  scheduling {fmt(f.scheduling, '.3f')} "
        f"({gp.scheduling.basis if gp.scheduling else 'manual'})  "
        f"job {fmt(f.job_product, '.3f')}  MPG {fmt(f.mpg, '.3f')}"
    )
    adv = gp.advice
    ck = adv.checkpoint
    if ck:
        print(
            f"  checkpoint every {ck.current_interval_seconds / 60:.1f} min; Young-Daly "
            f"{ck.optimal_interval_seconds / 60:.1f} min (waste {pct(ck.waste_at_current)} -> "
            f"{pct(ck.waste_at_optimal)})"
        )
    if "cost_per_useful_hour" in adv.model_fields_set:  # a price was given (null: no useful hour)
        print(
            f"  cost per useful accelerator-hour {fmt(adv.cost_per_useful_hour, '.2f')}  "
            f"chargeback {fmt(adv.chargeback_per_useful_hour, '.2f')}"
        )
    print_answers(gp)
    if what_if is not None:
        print_what_if(decode(WhatIfOut, what_if))
    return 0


def cmd_fleet_goodput(args: argparse.Namespace) -> int:
    from ..api.fleet_models import FleetGoodputOut

    with client(args) as c:
        doc = c.fleet_goodput(pool=args.pool, since=args.since, until=args.until, as_="json")
    if args.json:
        print_json(doc)
        return 0
    t = Table(
        ("POOL", "<16"),
        ("SCHED", ">7"),
        ("AVAIL", ">7"),
        ("PARTIAL", ">8"),
        ("STRANDED", ">9"),
        ("WAIT p50", ">9"),
    )
    print(t.header())
    for p in decode(FleetGoodputOut, doc).pools:
        s, w = p.shares, p.queue_wait_seconds
        print(
            t.row(
                p.pool,
                pct(p.scheduling_goodput),
                pct(p.availability),
                pct(s.partial),
                pct(s.stranded),
                f"{fmt(w.get('p50'), '.0f'):>8}s",
            )
        )
    return 0


def add_parsers(sub: Any) -> None:
    """Add ``goodput RUN`` and ``fleet goodput`` to the CLI's subparsers."""
    g = sub.add_parser("goodput", help="where a run's time went, and its goodput factors")
    g.add_argument("run")
    g.add_argument("--price", type=float, help="price per accelerator-hour, for the cost view")
    g.add_argument(
        "--scheduling",
        type=float,
        help="the pool's scheduling goodput (default: from the run's imported scheduler "
        "records, else 1)",
    )
    add_options(g)
    client_opts(g)
    g.set_defaults(func=cmd_goodput)
    fleet = sub.add_parser("fleet", help="fleet-wide views")
    fsub = fleet.add_subparsers(dest="fleet_command", required=True)
    fg = fsub.add_parser("goodput", help="scheduling goodput and queue waits per pool")
    fg.add_argument("--pool")
    fg.add_argument("--since", type=float, help="window start, UNIX seconds")
    fg.add_argument("--until", type=float, help="window end, UNIX seconds")
    client_opts(fg)
    fg.set_defaults(func=cmd_fleet_goodput)
    scheduler.add_fleet_parsers(fsub)
