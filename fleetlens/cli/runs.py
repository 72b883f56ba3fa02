"""``fleetlens runs`` and ``fleetlens run show RUN``."""

from __future__ import annotations

import argparse
import time
from typing import Any

from ._common import client, client_opts
from ._output import Table, fmt, print_json

__all__ = ["add_parsers", "cmd_run_show", "cmd_runs"]


def cmd_runs(args: argparse.Namespace) -> int:
    with client(args) as c:
        data = c.runs(project=args.project, limit=args.limit, as_="json")
    if args.json:
        print_json(data)
        return 0
    rows = data["runs"]
    t = Table(
        ("RUN", "<32"),
        ("PROJECT", "<16"),
        ("STATUS", "<9"),
        ("STEP", ">9"),
        ("RANKS", ">6"),
        ("JOBS", ">5"),
    )
    print(t.header())
    for r in rows:
        print(
            t.row(
                r["runId"],
                r["project"] or "-",
                r["status"],
                r["lastStep"],
                r["worldSize"],
                r["jobs"],
            )
        )
    if not rows:
        print("(no runs yet)")
    return 0


def cmd_run_show(args: argparse.Namespace) -> int:
    with client(args) as c:
        run = c.run(args.run)
        ranks = c.ranks(args.run, limit=args.top, sort="compute", as_="json")
    if args.json:
        print_json({"run": run, "ranks": ranks})
        return 0
    m = run.get("metrics", {})
    print(f"run {run['runId']}  project {run['project'] or '-'}  status {run['status']}")
    ended = run.get("ended")
    if ended:
        print(f"  ended: {ended['reason']}")
    if run["status"] == "RECORDED":
        print(
            f"  known only from recordings (traces, dumps), steps up to {run['lastStep']}: "
            f"fleetlens traces show {run['runId']}"
        )
    print(
        f"  step {fmt(run.get('step'))}  tokens {fmt(run.get('tokensProcessed'), ',')}  "
        f"ranks {run.get('worldSize')}  jobs {run.get('jobs')}"
    )
    lay = run.get("layout")
    if lay:
        sizes = " x ".join(f"{a} {lay[a]}" for a in ("tp", "cp", "pp", "dp") if lay[a] > 1)
        extra = "".join(f", {a} {lay[a]}" for a in ("ep", "vpp") if lay[a] > 1)
        print(f"  layout: {sizes}{extra} (from the {lay['source']}; ranks judged per stage)")
    reporting, world = run.get("ranksReporting"), run.get("worldSize")
    if reporting is not None and world and reporting < world:
        print(f"  only {reporting} of {world} ranks report steps")
    print(
        f"  step time {fmt(m.get('stepTimeMs'), '.1f')} ms (slowest rank, median of last "
        f"{run.get('window', {}).get('steps', 0)} steps)  tokens/s "
        f"{fmt(m.get('tokensPerSecond'), ',.0f')}  loss {fmt(m.get('loss'), '.4g')}"
    )
    done = run.get("completion")
    if done:
        at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(done["finishAt"]))
        print(
            f"  completion: step {fmt(run.get('step'), ',')} of {done['totalSteps']:,} "
            f"({done['targetKey']}), {fmt(done['secondsPerStep'], '.3g')} s/step lately: "
            f"{_hours(done['seconds'])} left, about {at}"
        )
    mfu = run.get("mfu") or {}
    if mfu.get("value") is not None:
        hfu = f"  HFU {fmt(mfu['hfu'], '.1%')}" if mfu.get("hfu") is not None else ""
        print(
            f"  MFU {fmt(mfu['value'], '.1%')}{hfu} ({mfu['devices']} x {mfu['accelerator'] or '-'}"
            f" at {fmt(mfu['peakFlopsPerDevice'] / 1e12, '.1f')} TFLOP/s {mfu['dtype']}, same "
            "window)"
        )
    elif mfu:
        print(f"  MFU unknown: {mfu.get('missing')}")
    if ranks["ranks"]:
        print(f"  slowest ranks by compute time, steps {ranks['fromStep']}-{ranks['toStep']}:")
        t = Table(
            ("RANK", ">6"),
            ("NODE", "<20"),
            ("GPU", ">4"),
            ("COMPUTE ms", ">11"),
            ("x MEDIAN", ">9"),
            ("WAIT ms", ">8"),
            ("STEP ms", ">8"),
            indent="    ",
        )
        print(t.header())
        for r in ranks["ranks"]:
            print(
                t.row(
                    r["rank"],
                    r["node"] or "-",
                    r["gpu"],
                    fmt(r["computeMs"], ".1f"),
                    fmt(r["computeSlowdown"], ".3f"),
                    fmt(r["commMs"], ".1f"),
                    fmt(r["stepTimeMs"], ".1f"),
                )
            )
    return 0


def _hours(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def add_parsers(sub: Any) -> None:
    """Add ``runs`` and ``run show`` to the CLI's subparsers."""
    sp = sub.add_parser("runs", help="list runs")
    client_opts(sp)
    sp.add_argument("--project")
    sp.add_argument("--limit", type=int, default=50)
    sp.set_defaults(func=cmd_runs)
    sp = sub.add_parser("run", help="one run")
    rsub = sp.add_subparsers(dest="run_command", required=True)
    show = rsub.add_parser("show", help="status, speed and slowest ranks of a run")
    show.add_argument("run")
    show.add_argument("--top", type=int, default=5, help="slowest ranks to show")
    client_opts(show)
    show.set_defaults(func=cmd_run_show)
