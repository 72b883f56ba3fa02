import argparse
import sys

from .run import add_parser

parser = argparse.ArgumentParser(prog="python -m fleetlens.agent")
add_parser(parser.add_subparsers(dest="command", required=False))
args = parser.parse_args(["agent", *sys.argv[1:]])
sys.exit(args.func(args))
