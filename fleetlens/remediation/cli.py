"""``fleetlens remediations [list | show ID | approve ID | reject ID]``: auto-cordon actions."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_parser"]


def _phases(a: dict[str, Any]) -> str:
    return ", ".join(
        f"{name} {p['seconds']:.2f}s" if p["seconds"] is not None else f"{name} ..."
        for name, p in a["phases"].items()
    )


def main(args: argparse.Namespace) -> int:
    from ..cli import _get, _post

    cmd = args.remediations_command or "list"
    if cmd == "list":
        data = _get(args, "/v1/remediations", runId=args.run, state=args.state)
        if args.json:
            print(json.dumps(data, indent=2))
            return 0
        print(f"mode: {data['mode']}")
        print(f"{'ID':>5} {'STATE':<18} {'NODE':<16} {'REASON':<22} {'RUN':<28} RECOVERY")
        for a in data["remediations"]:
            rec = f"{a['recoveryS']:.1f}s, {a['stepsLost']} steps lost" if a["recoveryS"] else "-"
            print(
                f"{a['id']:>5} {a['state']:<18} {a['node']:<16} {a['reason']:<22} "
                f"{a['runId']:<28} {rec}"
            )
        if not data["remediations"]:
            print("(no actions)")
        return 0
    if cmd == "show":
        a = _get(args, f"/v1/remediations/{args.id}")
    else:
        a = _post(args, f"/v1/remediations/{args.id}/{cmd}")
    if args.json:
        print(json.dumps(a, indent=2))
        return 0
    print(f"#{a['id']} {a['state']}: {a['summary']}")
    print(
        f"  run {a['runId']} ({a['jobId']}), world {a['worldBefore']} -> {a['worldAfter'] or '-'}"
    )
    print(f"  phases: {_phases(a)}")
    if a["error"]:
        print(f"  error: {a['error']}")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("remediations", help="auto-cordon actions: list, show, approve, reject")
    s = p.add_subparsers(dest="remediations_command")
    lst = s.add_parser("list", help="actions, newest first")
    lst.add_argument("--run")
    lst.add_argument("--state")
    subs = [p, lst]
    for name, helptext in (
        ("show", "one action with its phases"),
        ("approve", "carry out an action awaiting approval"),
        ("reject", "decline an action awaiting approval"),
    ):
        sp = s.add_parser(name, help=helptext)
        sp.add_argument("id", type=int)
        subs.append(sp)
    for sp in subs:
        sp.add_argument("--server", help="server URL (default $FLEETLENS_SERVER or loopback)")
        sp.add_argument("--json", action="store_true", help="print the API's JSON")
    p.set_defaults(func=main, run=None, state=None)
