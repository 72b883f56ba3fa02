"""``fleetlens alerts [list | ack ID | resolve ID | incident ID | prometheus-rules]``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._common import client, client_opts, decode
from ._output import Table, print_json

__all__ = ["add_parser", "cmd_alerts"]


def _prometheus_rules(args: argparse.Namespace) -> int:
    from ..alerts.policy import DEFAULT_POLICY
    from ..alerts.rules import prometheus_rules

    policy = DEFAULT_POLICY
    if args.policy:
        import yaml

        with open(args.policy) as fh:
            policy = policy.merged((yaml.safe_load(fh) or {}).get("rules", {}))
    text = prometheus_rules(policy)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
        print(f"wrote {args.out}; check it with: promtool check rules {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_alerts(args: argparse.Namespace) -> int:
    from ..api.alert_models import AlertListOut

    cmd = args.alerts_command or "list"
    if cmd == "prometheus-rules":
        return _prometheus_rules(args)
    with client(args) as c:
        if cmd == "incident":
            print_json(c.get(f"/v1/incidents/{args.id}"))
            return 0
        if cmd in ("ack", "resolve"):
            print_json(c.post(f"/v1/alerts/{args.id}/{cmd}"))
            return 0
        doc = c.alerts(state=args.state, run_id=args.run, as_="json")
    if args.json:
        print_json(doc)
        return 0
    data = decode(AlertListOut, doc)
    t = Table(
        ("ID", ">5"),
        ("STATE", "<9"),
        ("SEVERITY", "<8"),
        ("ALERT", "<26"),
        ("RUN", "<28"),
        ("WHERE", ""),
    )
    print(t.header())
    for a in data.alerts:
        where = " ".join(
            f"{k}={a.labels[k]}" for k in ("node", "gpu", "rank", "rack") if a.labels.get(k)
        )
        print(t.row(a.id, a.state, a.severity, a.alertname, a.run_id, where))
    if not data.alerts:
        print("(no alerts)")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("alerts", help="alerts and incidents; the policy as Prometheus rules")
    s = p.add_subparsers(dest="alerts_command")
    lst = s.add_parser("list", help="alerts, newest first")
    lst.add_argument("--state", choices=("firing", "resolved"))
    lst.add_argument("--run")
    for name, helptext in (
        ("ack", "acknowledge an alert"),
        ("resolve", "resolve by hand"),
        ("incident", "show an incident"),
    ):
        sp = s.add_parser(name, help=helptext)
        sp.add_argument("id", type=int)
        client_opts(sp)
    rules = s.add_parser("prometheus-rules", help="write the policy as a Prometheus rule file")
    rules.add_argument("--policy", help="YAML file of policy overrides")
    rules.add_argument("--out", help="write here instead of stdout")
    for sp in (p, lst):
        client_opts(sp)
    p.set_defaults(func=cmd_alerts, state=None, run=None)
