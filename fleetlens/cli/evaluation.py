"""``fleetlens eval worker | submit | status | gate | promote``.

The server is ``--server`` or ``$FLEETLENS_SERVER``; the token ``--token`` or ``$FLEETLENS_TOKEN``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import FleetlensError
from ._common import client, client_opts
from ._output import print_json

__all__ = ["add_parser", "cmd_eval"]


def _load(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _worker(args: argparse.Namespace) -> int:
    from ..client import resolve_server
    from ..evaluation.worker import Worker, WorkerConfig

    worker = Worker(
        WorkerConfig(
            server=resolve_server(args.server),
            token=args.token,
            worker_id=args.worker_id or "",
            lease_s=args.lease_s,
            poll_s=args.poll_s,
            idle_exit_s=args.idle_exit,
            max_shards=args.max_shards,
        )
    )
    try:
        done = worker.run()
    except KeyboardInterrupt:
        done = worker.shards_done
    finally:
        worker.close()
    print(f"worker {worker.worker_id}: {done} shard(s) completed", file=sys.stderr)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    cmd = args.eval_command
    if cmd == "worker":
        return _worker(args)
    if cmd not in ("submit", "status", "gate", "promote"):
        raise FleetlensError("name a command: fleetlens eval worker|submit|status|gate|promote")
    with client(args) as c:
        if cmd == "submit":
            out = c.post("/v1/evaluations", _load(args.request))
        elif cmd == "status":
            out = c.get(f"/v1/evaluations/{args.evaluation_id}")
        elif cmd == "gate":
            body = {"modelId": args.model, "version": args.version,
                    "policies": _load(args.policies), "baselineAlias": args.baseline}  # fmt: skip
            out = c.post("/v1/gates", body)
        else:
            body = {"version": args.version, "decisionId": args.decision or "",
                    "overrideReason": args.override_reason or ""}  # fmt: skip
            out = c.post(f"/v1/models/{args.model}/aliases/{args.alias}", body)
    if cmd == "status" and not args.json:
        p = out.get("progress", {})
        print(
            f"{out['evaluationId']} {out['state']} cache_hit={out['cacheHit']} "
            f"examples {p.get('examplesDone', '-')}/{p.get('examples', '-')} "
            f"shards done {p.get('shardsDone', '-')} failed {p.get('shardsFailed', '-')}"
        )
        for bench, ms in (out.get("metrics") or {}).items():
            for name, v in ms.items():
                print(f"  {bench}/{name} = {v['mean']:.4f} ± {v['stderr']:.4f} (n={v['n']})")
        return 0 if out["state"] != "FAILED" else 1
    print_json(out)
    if cmd == "gate":
        return 0 if out["passed"] else 1
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="evaluation: workers, submit, status, gates, promotion")
    s = p.add_subparsers(dest="eval_command")
    w = s.add_parser("worker", help="lease and run evaluation shards from the server")
    w.add_argument("--worker-id", help="default: HOST:PID")
    w.add_argument("--lease-s", type=float, default=30.0, help="lease length (heartbeat: 1/3)")
    w.add_argument("--poll-s", type=float, default=0.5, help="wait between empty leases")
    w.add_argument("--idle-exit", type=float, help="exit after this many idle seconds")
    w.add_argument("--max-shards", type=int, help="exit after this many shards")
    sm = s.add_parser("submit", help="queue an evaluation (JSON request file)")
    sm.add_argument("request", help="JSON file: {modelId, modelVersion, adapter, suite, ...}")
    st = s.add_parser("status", help="an evaluation's state, progress and metrics")
    st.add_argument("evaluation_id")
    g = s.add_parser("gate", help="judge a model version against production")
    g.add_argument("model")
    g.add_argument("version")
    g.add_argument("--policies", required=True, help="JSON file: a list of policies")
    g.add_argument("--baseline", default="production", help="baseline alias")
    pr = s.add_parser("promote", help="move an alias (canary/production need a passing gate)")
    pr.add_argument("model")
    pr.add_argument("alias")
    pr.add_argument("version")
    pr.add_argument("--decision", help="id of a passing gate decision")
    pr.add_argument("--override-reason", help="admin only: promote without a passing gate")
    for sp in (p, w, sm, st, g, pr):
        client_opts(sp)
    p.set_defaults(func=cmd_eval, eval_command=None)
