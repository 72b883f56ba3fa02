"""The command line: ``fleetlens serve | demo | runs | run show | goodput | sim | tokens ...``.

One module per command group; every command that talks to a server does it through
:class:`fleetlens.client.Client`, and prints through :mod:`fleetlens.cli._output`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..errors import FleetlensError

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS = (
    "serve",
    "demo",
    "config",
    "runs",
    "run",
    "frontier",
    "memory",
    "logs",
    "goodput",
    "fleet",
    "sim",
    "agent",
    "traces",
    "fr",
    "import",
    "alerts",
    "grafana",
    "incidents",
    "failure-window",
    "remediations",
    "stragglers",
    "diagnose",
    "whatif",
    "regression",
    "compare",
    "lineage",
    "models",
    "eval",
    "tokens",
    "tenants",
    "spool",
)


def build_parser() -> argparse.ArgumentParser:
    from ..agent import run as agent
    from . import (
        admin,
        alerts,
        detect,
        evaluation,
        flight_recorder,
        goodput,
        grafana,
        graph,
        imports,
        incidents,
        remediations,
        runs,
        serve,
        sim,
        spool,
        traces,
    )

    p = argparse.ArgumentParser(prog="fleetlens", description="fleetlens: where the GPU time went")
    sub = p.add_subparsers(dest="command", required=True)
    serve.add_serve(sub)
    serve.add_demo(sub)
    serve.add_config(sub)
    runs.add_parsers(sub)
    goodput.add_parsers(sub)
    sim.add_parser(sub)
    agent.add_parser(sub)
    traces.add_parser(sub)
    flight_recorder.add_parser(sub)
    imports.add_parser(sub)
    alerts.add_parser(sub)
    grafana.add_parser(sub)
    incidents.add_parsers(sub)
    remediations.add_parser(sub)
    detect.add_parsers(sub)
    graph.add_parsers(sub)
    evaluation.add_parser(sub)
    admin.add_parsers(sub)
    spool.add_parser(sub)
    return p


def _stdout_gone() -> int:
    """The reader went away (``fleetlens runs | head -1``): exit quietly, as the docs advise.

    Python flushes stdout again at exit; pointing it at devnull keeps that flush from raising
    a second BrokenPipeError (https://docs.python.org/3/library/signal.html#note-on-sigpipe).
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by the pipe


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        code = int(args.func(args))
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _stdout_gone()
    except FleetlensError as exc:
        print(f"fleetlens: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
