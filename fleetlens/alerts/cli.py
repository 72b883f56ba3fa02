"""``fleetlens alerts [list | ack ID | resolve ID | incident ID | prometheus-rules]``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_parser"]


def main(args: argparse.Namespace) -> int:
    from ..cli import _get, _post

    cmd = args.alerts_command or "list"
    if cmd == "prometheus-rules":
        from .policy import DEFAULT_POLICY
        from .rules import prometheus_rules

        policy = DEFAULT_POLICY
        if args.policy:
            import yaml

            with open(args.policy) as fh:
                policy = policy.merged((yaml.safe_load(fh) or {}).get("rules", {}))
        text = prometheus_rules(policy)
        if args.out:
            with open(args.out, "w") as fh:
                fh.write(text)
            print(
                f"wrote {args.out}; check it with: promtool check rules {args.out}", file=sys.stderr
            )
        else:
            sys.stdout.write(text)
        return 0
    if cmd == "list":
        data = _get(args, "/v1/alerts", state=args.state, runId=args.run)
        if args.json:
            print(json.dumps(data, indent=2))
            return 0
        print(f"{'ID':>5} {'STATE':<9} {'SEVERITY':<8} {'ALERT':<26} {'RUN':<28} WHERE")
        for a in data["alerts"]:
            where = " ".join(
                f"{k}={a['labels'][k]}"
                for k in ("node", "gpu", "rank", "rack")
                if a["labels"].get(k)
            )
            print(
                f"{a['id']:>5} {a['state']:<9} {a['severity']:<8} {a['alertname']:<26} "
                f"{a['runId']:<28} {where}"
            )
        if not data["alerts"]:
            print("(no alerts)")
        return 0
    if cmd == "incident":
        print(json.dumps(_get(args, f"/v1/incidents/{args.id}"), indent=2))
        return 0
    print(json.dumps(_post(args, f"/v1/alerts/{args.id}/{cmd}"), indent=2))
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
        sp.add_argument("--server")
        sp.add_argument("--json", action="store_true")
    rules = s.add_parser("prometheus-rules", help="write the policy as a Prometheus rule file")
    rules.add_argument("--policy", help="YAML file of policy overrides")
    rules.add_argument("--out", help="write here instead of stdout")
    for sp in (p, lst):
        sp.add_argument("--server", help="server URL (default $FLEETLENS_SERVER or loopback)")
        sp.add_argument("--json", action="store_true", help="print the API's JSON")
    p.set_defaults(func=main, state=None, run=None)
