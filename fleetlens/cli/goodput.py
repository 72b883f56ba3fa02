"""``fleetlens goodput RUN`` and ``fleetlens fleet goodput``."""

from __future__ import annotations

import argparse
from typing import Any

from . import scheduler
from ._common import client, client_opts
from ._output import Table, fmt, pct, print_json
from .goodput_answers import (
    add_options,
    parse_ceilings,
    parse_what_if,
    print_answers,
    print_what_if,
)

__all__ = ["add_parsers", "cmd_fleet_goodput", "cmd_goodput"]


def cmd_goodput(args: argparse.Namespace) -> int:
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
        if args.what_if:
            change = parse_what_if(args.what_if, data["breakdown"]["measuredTerms"])
            change.update(scheduling=data["factors"]["scheduling"])
            change.update(accelerator=args.accelerator, dtype=args.dtype)
            data["whatIf"] = c.whatif(args.run, {k: v for k, v in change.items() if v is not None})
    if args.json:
        print_json(data)
        return 0
    bd, f = data["breakdown"], data["factors"]
    print(
        f"run {data['runId']}  wall {bd['wallSeconds'] / 3600:.2f} h  held "
        f"{bd['heldSeconds'] / 3600:.2f} h  attempts {bd['attempts']}"
    )
    t = Table(("LINE", "<12"), ("HOURS", ">10"), ("SHARE", ">7"), (" FACTOR", ""), indent="  ")
    print(t.header())
    for line in bd["lines"]:
        if line["seconds"] <= 0 and line["category"] != "unaccounted":
            continue
        share = pct(line["share"])
        hours = f"{line['seconds'] / 3600:.3f}"
        print(t.row(line["category"], hours, share, f" {line['factor']}"))
    if bd["instrumentationHole"]:
        print(f"  ! unaccounted {pct(bd['unaccountedShare'])} of wall-clock: instrumentation hole")
    print(
        f"  runtime {fmt(f['runtime'], '.3f')}  program {fmt(f['program'], '.3f')} "
        f"({data['program']['programBasis']})  scheduling {fmt(f['scheduling'], '.3f')} "
        f"({data.get('scheduling', {}).get('basis', 'manual')})  "
        f"job {fmt(f['jobProduct'], '.3f')}  MPG {fmt(f['mpg'], '.3f')}"
    )
    adv = data["advice"]
    ck = adv.get("checkpoint")
    if ck:
        print(
            f"  checkpoint every {ck['currentIntervalSeconds'] / 60:.1f} min; Young-Daly "
            f"{ck['optimalIntervalSeconds'] / 60:.1f} min (waste {pct(ck['wasteAtCurrent'])} -> "
            f"{pct(ck['wasteAtOptimal'])})"
        )
    if "costPerUsefulHour" in adv:
        print(
            f"  cost per useful accelerator-hour {fmt(adv['costPerUsefulHour'], '.2f')}  "
            f"chargeback {fmt(adv['chargebackPerUsefulHour'], '.2f')}"
        )
    print_answers(data)
    if "whatIf" in data:
        print_what_if(data["whatIf"])
    return 0


def cmd_fleet_goodput(args: argparse.Namespace) -> int:
    with client(args) as c:
        data = c.fleet_goodput(pool=args.pool, since=args.since, until=args.until, as_="json")
    if args.json:
        print_json(data)
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
    for p in data["pools"]:
        s, w = p["shares"], p["queueWaitSeconds"]
        print(
            t.row(
                p["pool"],
                pct(p["schedulingGoodput"]),
                pct(p["availability"]),
                pct(s["partial"]),
                pct(s["stranded"]),
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
