"""``fleetlens remediations [list | show ID | approve ID | reject ID]``: auto-cordon actions."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ._common import client, client_opts, decode, query
from ._output import Table, print_json

if TYPE_CHECKING:
    from ..api.remediation_models import ActionOut

__all__ = ["add_parser", "cmd_remediations"]


def _phases(a: ActionOut) -> str:
    return ", ".join(
        f"{name} {p.seconds:.2f}s" if p.seconds is not None else f"{name} ..."
        for name, p in a.phases.items()
    )


def cmd_remediations(args: argparse.Namespace) -> int:
    from ..api.remediation_models import ActionOut, RemediationListOut

    cmd = args.remediations_command or "list"
    with client(args) as c:
        if cmd == "list":
            doc = c.get("/v1/remediations", **query(run_id=args.run, state=args.state))
        elif cmd == "show":
            doc = c.get(f"/v1/remediations/{args.id}")
        else:
            doc = c.post(f"/v1/remediations/{args.id}/{cmd}")
    if args.json:
        print_json(doc)
        return 0
    if cmd == "list":
        data = decode(RemediationListOut, doc)
        print(f"mode: {data.mode}")
        t = Table(
            ("ID", ">5"),
            ("STATE", "<18"),
            ("NODE", "<16"),
            ("REASON", "<22"),
            ("RUN", "<28"),
            ("RECOVERY", ""),
        )
        print(t.header())
        for r in data.remediations:
            rec = f"{r.recovery_s:.1f}s, {r.steps_lost} steps lost" if r.recovery_s else "-"
            print(t.row(r.id, r.state, r.node, r.reason, r.run_id, rec))
        if not data.remediations:
            print("(no actions)")
        return 0
    a = decode(ActionOut, doc)
    print(f"#{a.id} {a.state}: {a.summary}")
    print(f"  run {a.run_id} ({a.job_id}), world {a.world_before} -> {a.world_after or '-'}")
    print(f"  phases: {_phases(a)}")
    if a.error:
        print(f"  error: {a.error}")
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
        client_opts(sp)
    p.set_defaults(func=cmd_remediations, run=None, state=None)
