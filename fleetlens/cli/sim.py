"""``fleetlens sim run SCENARIO`` and ``fleetlens sim list``: the fleet simulator."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from ._common import client_opts
from ._output import print_json

__all__ = ["add_parser", "cmd_sim"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "sim", help="simulate a training fleet with injected faults and ground truth"
    )
    sub = p.add_subparsers(dest="sim_command", required=True)
    run = sub.add_parser("run", help="run a scenario (a shipped name or a YAML path)")
    run.add_argument("scenario")
    client_opts(run, json=False)
    run.add_argument(
        "--speed",
        type=float,
        default=None,
        help="simulated seconds per wall second; 0 = as fast as possible",
    )
    run.add_argument("--out", default=None, help="directory for batch files and ground truth")
    run.add_argument("--seed", type=int, default=None)
    run.add_argument(
        "--fleet",
        default=None,
        help="the fleet the scenario runs on: scenarios given the same NAME share node, rack "
        "and GPU names (default: a fleet of its own, named after the scenario's run, so one "
        "scenario's faults are never on another's nodes)",
    )
    lst = sub.add_parser("list", help="list the shipped scenarios")
    lst.add_argument("--json", action="store_true", help="print {name: description} as JSON")
    p.set_defaults(func=cmd_sim)
    return p


def cmd_sim(args: argparse.Namespace) -> int:
    from ..sim.library import list_scenarios, load_scenario, run_scenario

    if args.sim_command == "list":
        scenarios = list_scenarios()
        if args.json:
            print_json(scenarios)
            return 0
        for name, desc in scenarios.items():
            print(f"{name:24s} {desc}")
        return 0
    if not args.server and not args.out:
        print("sim run: give --server URL and/or --out DIR", file=sys.stderr)
        return 2
    scn = load_scenario(args.scenario)
    # Scenarios played into one server are separate fleets unless told to share one: their
    # node names are the server's only way to tell one fleet's hardware from another's.
    cluster = dataclasses.replace(scn.cluster, fleet=args.fleet or scn.job.run_id)
    res = run_scenario(
        scn,
        server=args.server,
        out_dir=args.out,
        speed=args.speed,
        seed=args.seed,
        token=args.token,
        cluster=cluster,
    )
    t = res.truth
    print(
        f"{t.run_id}: {sum(res.records.values()):,} records in {res.elapsed_s:.1f}s, "
        f"attempts {t.job_ids}, {len(t.faults)} faults injected",
        file=sys.stderr,
    )
    if res.truth_path:
        print(f"ground truth: {res.truth_path}", file=sys.stderr)
    print(
        json.dumps(
            {
                "run_id": t.run_id,
                "job_ids": t.job_ids,
                "records": res.records,
                "losses": t.losses,
                "faults": [f.id for f in t.faults],
            }
        )
    )
    return 0
