"""``fleetlens spool [--send]``: what waits in this node's spools, and sending what gone ranks left.

A rank's SDK spools the batches the collector did not take. What a rank that will not come back
left (killed while the collector was away, or finished with its last batches unsent) is sent by
the next run on the node bound for the same server and token (:mod:`fleetlens.sdk.orphans`).
This command shows each spool directory of this user under the spool root (whose process holds
it, what waits in it, whether it is bound where this environment sends) and, with ``--send``,
sends the gone ones' batches now: the step for a job's epilogue (Slurm's ``TaskEpilog`` runs
with the job's environment), so that the last job on a node does not wait for a next one.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
from typing import Any

from ._output import Table, print_json

__all__ = ["add_parser", "cmd_spool"]


def cmd_spool(args: argparse.Namespace) -> int:
    from ..sdk.config import SDKConfig
    from ..sdk.orphans import remove_if_empty, send_gone, survey
    from ..sdk.spool import Spool, default_spool_root
    from ..sdk.transport import HttpTransport

    env = dict(os.environ)
    if args.root:
        env["FLEETLENS_SPOOL_ROOT"] = args.root
    # The SDK's own resolution, so that "bound for this server and token" means what a rank
    # started here would have used.
    cfg = SDKConfig.resolve({"server": args.server, "token": args.token}, env)
    root = default_spool_root(env)
    if not args.send:
        dirs = survey(root, cfg.spool_owner)
        if args.json:
            print_json([dataclasses.asdict(d) for d in dirs])
            return 0
        table = Table(
            ("SPOOL", "<44"), ("STATE", "<10"), ("YOURS", "<6"), ("BATCHES", ">8"), ("BYTES", "")
        )
        print(table.header())
        for d in dirs:
            print(table.row(d.name, d.state, "yes" if d.yours else "no", d.batches, d.bytes))
        waiting = sum(d.batches for d in dirs if d.state == "gone" and d.yours)
        print(
            f"{root}: {waiting} batches of gone processes bound for {cfg.server}; the next run "
            "on this node sends them, or `fleetlens spool --send` now",
            file=sys.stderr,
        )
        return 0
    # This command's own spool, beside the others: what it adopts and cannot send waits there
    # and is adopted again once this process has exited.
    name = f"send-{socket.gethostname()}-{os.getpid()}"
    spool = Spool(os.path.join(root, name), cfg.spool_max_bytes, owner=cfg.spool_owner)
    transport = HttpTransport(cfg.server, cfg.token, cfg.send_timeout)
    try:
        done = send_gone(spool, transport)
    finally:
        transport.close()
    if not done.left:
        remove_if_empty(spool.dir)
    if args.json:
        print_json({"server": cfg.server, **dataclasses.asdict(done)})
    else:
        refused = f" ({done.refused} refused as bad, dropped)" if done.refused else ""
        print(
            f"sent {done.batches} batches from {done.spools} spools of gone processes "
            f"to {cfg.server}{refused}"
        )
    if done.error:
        print(
            f"fleetlens: {done.left} batches wait in {spool.dir} ({done.error}); the next run "
            "on this node sends them, or `fleetlens spool --send` again",
            file=sys.stderr,
        )
        return 1
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "spool", help="what waits in this node's spools; --send sends what gone ranks left"
    )
    p.add_argument("--root", help="the spool root (default $FLEETLENS_SPOOL_ROOT or the SDK's)")
    p.add_argument("--server", help="server URL, as the job's (default $FLEETLENS_SERVER)")
    p.add_argument("--token", help="the job's token (default $FLEETLENS_TOKEN)")
    p.add_argument("--send", action="store_true", help="send the gone spools bound there now")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_spool)
