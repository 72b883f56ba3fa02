"""``python -m fleetlens.evaluation eval worker --server URL``: the eval CLI on its own."""

from __future__ import annotations

import argparse
import sys

from ..cli.evaluation import add_parser
from ..errors import FleetlensError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetlens.evaluation")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except FleetlensError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
