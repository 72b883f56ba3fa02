"""``fleetlens goodput RUN`` and ``fleetlens fleet goodput``: clients of the goodput API."""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from .cli import _fmt, _get

__all__ = ["add_parsers", "cmd_fleet_goodput", "cmd_goodput"]


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100.0 * float(v):.1f}%"


def cmd_goodput(args: argparse.Namespace) -> int:
    data = _get(
        args,
        f"/v1/runs/{urllib.parse.quote(args.run, safe='')}/goodput",
        price=args.price,
        scheduling=args.scheduling,
    )
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    bd, f = data["breakdown"], data["factors"]
    print(
        f"run {data['runId']}  wall {bd['wallSeconds'] / 3600:.2f} h  held "
        f"{bd['heldSeconds'] / 3600:.2f} h  attempts {bd['attempts']}"
    )
    print(f"  {'LINE':<12} {'HOURS':>10} {'SHARE':>7}  FACTOR")
    for line in bd["lines"]:
        if line["seconds"] <= 0 and line["category"] != "unaccounted":
            continue
        print(
            f"  {line['category']:<12} {line['seconds'] / 3600:>10.3f} {_pct(line['share']):>7}"
            f"  {line['factor']}"
        )
    if bd["instrumentationHole"]:
        print(f"  ! unaccounted {_pct(bd['unaccountedShare'])} of wall-clock: instrumentation hole")
    print(
        f"  runtime {_fmt(f['runtime'], '.3f')}  program {_fmt(f['program'], '.3f')} "
        f"({data['program']['programBasis']})  scheduling {_fmt(f['scheduling'], '.3f')}  "
        f"job {_fmt(f['jobProduct'], '.3f')}  MPG {_fmt(f['mpg'], '.3f')}"
    )
    adv = data["advice"]
    ck = adv.get("checkpoint")
    if ck:
        print(
            f"  checkpoint every {ck['currentIntervalSeconds'] / 60:.1f} min; Young-Daly "
            f"{ck['optimalIntervalSeconds'] / 60:.1f} min (waste {_pct(ck['wasteAtCurrent'])} -> "
            f"{_pct(ck['wasteAtOptimal'])})"
        )
    if "costPerUsefulHour" in adv:
        print(
            f"  cost per useful accelerator-hour {_fmt(adv['costPerUsefulHour'], '.2f')}  "
            f"chargeback {_fmt(adv['chargebackPerUsefulHour'], '.2f')}"
        )
    return 0


def cmd_fleet_goodput(args: argparse.Namespace) -> int:
    data = _get(args, "/v1/fleet/goodput", pool=args.pool, **{"from": args.since, "to": args.until})
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"{'POOL':<16} {'SCHED':>7} {'AVAIL':>7} {'PARTIAL':>8} {'STRANDED':>9} {'WAIT p50':>9}")
    for p in data["pools"]:
        s, w = p["shares"], p["queueWaitSeconds"]
        print(
            f"{p['pool']:<16} {_pct(p['schedulingGoodput']):>7} {_pct(p['availability']):>7} "
            f"{_pct(s['partial']):>8} {_pct(s['stranded']):>9} {_fmt(w.get('p50'), '.0f'):>8}s"
        )
    return 0


def _client_opts(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--server", help="server URL (default $FLEETLENS_SERVER or loopback)")
    sp.add_argument("--json", action="store_true", help="print the API's JSON")


def add_parsers(sub: Any) -> None:
    """Add ``goodput RUN`` and ``fleet goodput`` to the CLI's subparsers."""
    g = sub.add_parser("goodput", help="where a run's time went, and its goodput factors")
    g.add_argument("run")
    g.add_argument("--price", type=float, help="price per accelerator-hour, for the cost view")
    g.add_argument("--scheduling", type=float, help="the pool's scheduling goodput (default 1)")
    _client_opts(g)
    g.set_defaults(func=cmd_goodput)
    fleet = sub.add_parser("fleet", help="fleet-wide views")
    fsub = fleet.add_subparsers(dest="fleet_command", required=True)
    fg = fsub.add_parser("goodput", help="scheduling goodput and queue waits per pool")
    fg.add_argument("--pool")
    fg.add_argument("--since", type=float, help="window start, UNIX seconds")
    fg.add_argument("--until", type=float, help="window end, UNIX seconds")
    _client_opts(fg)
    fg.set_defaults(func=cmd_fleet_goodput)
