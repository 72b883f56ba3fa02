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

from ._common import client_opts
from ._output import Table, print_json

__all__ = ["add_parser", "cmd_spool"]


def cmd_spool(args: argparse.Namespace) -> int:
    from ..sdk.config import SDKConfig
    from ..sdk.orphans import send_gone, survey
    from ..sdk.route import open_transport
    from ..sdk.spool import Spool

    # The SDK's own resolution, so that "bound for this server and token" and "beside the
    # job's spools" mean what they meant for a rank started with this environment.
    cfg = SDKConfig.resolve({"server": args.server, "token": args.token}, os.environ)
    root = args.root or os.path.dirname(cfg.spool_dir)
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
    # This command's own spool, beside the others: what it adopts and cannot send waits there,
    # let go of when it is done, for the next run or `--send` to adopt again.
    name = f"send-{socket.gethostname()}-{os.getpid()}"
    spool = Spool(os.path.join(root, name), cfg.spool_max_bytes, owner=cfg.spool_owner)
    transport, _ = open_transport(cfg)  # through the node's relay, as the ranks send
    try:
        done = send_gone(spool, transport, cfg.flush_interval)
    finally:
        transport.close()
        spool.release()
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
    p.add_argument(
        "--root",
        help="the spool root (default: where the SDK spools, the parent of $FLEETLENS_SPOOL_DIR "
        "or $FLEETLENS_SPOOL_ROOT)",
    )
    client_opts(p)  # the job's server and token: which spools are this caller's to send
    p.add_argument("--send", action="store_true", help="send the gone spools bound there now")
    p.set_defaults(func=cmd_spool)
