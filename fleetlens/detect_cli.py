"""``fleetlens stragglers RUN`` and ``fleetlens diagnose RUN``: clients of the findings API."""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from .cli import _fmt, _get

__all__ = ["add_parsers", "cmd_diagnose", "cmd_stragglers"]


def _path(run: str, what: str) -> str:
    return f"/v1/runs/{urllib.parse.quote(run, safe='')}/{what}"


def cmd_stragglers(args: argparse.Namespace) -> int:
    data = _get(args, _path(args.run, "stragglers"))
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    rows = data["stragglers"]
    if not rows:
        print(f"run {data['runId']}: no stragglers found")
        return 0
    print(f"{'DIAGNOSIS':<24} {'RANKS':<16} {'NODES':<24} {'FROM':>7} {'TO':>7} {'CONF':>5}")
    for r in rows:
        ranks = ",".join(map(str, r["ranks"][:4])) + ("..." if len(r["ranks"]) > 4 else "")
        nodes = ",".join(r["nodes"][:2]) + ("..." if len(r["nodes"]) > 2 else "")
        print(
            f"{r['diagnosis']:<24} {ranks:<16} {nodes:<24} {_fmt(r['startStep']):>7} "
            f"{_fmt(r['endStep']):>7} {_fmt(r['confidence'], '.2f'):>5}"
        )
        print(f"  {r['summary']}")
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    data = _get(args, _path(args.run, "diagnosis"))
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    rows = data["findings"]
    if not rows:
        print(f"run {data['runId']}: nothing to diagnose")
        return 0
    for r in rows:
        print(
            f"step {_fmt(r['step']):>8}  {r['diagnosis']:<22} owner {r['owner']:<15} "
            f"confidence {_fmt(r['confidence'], '.2f')}"
        )
        print(f"  {r['summary']}")
        for e in r["evidence"][:4]:
            value = e.get("value")
            base = f" (baseline {_fmt(e['baseline'], '.4g')})" if e.get("baseline") else ""
            shown = _fmt(value, ".4g") if isinstance(value, (int, float)) else str(value)
            print(f"    {e.get('metric') or e.get('signal')}: {shown}{base}")
    return 0


def _client_opts(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--server", help="server URL (default $FLEETLENS_SERVER or loopback)")
    sp.add_argument("--json", action="store_true", help="print the API's JSON")


def add_parsers(sub: Any) -> None:
    """Add ``stragglers RUN`` and ``diagnose RUN`` to the CLI's subparsers."""
    s = sub.add_parser("stragglers", help="a run's slow ranks, classified, with their GPUs")
    s.add_argument("run")
    _client_opts(s)
    s.set_defaults(func=cmd_stragglers)
    d = sub.add_parser("diagnose", help="a run's root causes with evidence, confidence, owner")
    d.add_argument("run")
    _client_opts(d)
    d.set_defaults(func=cmd_diagnose)
