"""``fleetlens grafana --out DIR``: the Grafana dashboards (and their provisioning file) over the
Prometheus metrics fleetlens exports (:mod:`fleetlens.grafana`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_parser", "cmd_grafana"]


def cmd_grafana(args: argparse.Namespace) -> int:
    from ..grafana import DASHBOARDS, write

    for path in write(args.out):
        print(path)
    print(
        f"{len(DASHBOARDS)} dashboards: point Grafana's provisioning at "
        f"{args.out}/fleetlens-dashboards.yaml (or import the JSON), with a Prometheus data "
        "source that scrapes the server's /metrics",
        file=sys.stderr,
    )
    return 0


def add_parser(sub: Any) -> None:
    g = sub.add_parser(
        "grafana",
        help="write Grafana dashboards (a run, on-call, the fleet) over the server's /metrics",
    )
    g.add_argument("--out", required=True, help="directory to write the dashboards into")
    g.set_defaults(func=cmd_grafana)
