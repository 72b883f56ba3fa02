"""``fleetlens eval worker | submit | lm-eval | status | gate | promote | suites | triggers``.

The server is ``--server`` or ``$FLEETLENS_SERVER``; the token ``--token`` or ``$FLEETLENS_TOKEN``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ..errors import FleetlensError
from ._common import client, client_opts, decode
from ._output import fmt, print_json

if TYPE_CHECKING:  # the models are imported where a command sends one (pydantic is not cheap)
    from pydantic import BaseModel

    from ..api.evaluation_requests import EvaluationBody

__all__ = ["add_parser", "cmd_eval"]


def _load(path: str) -> Any:
    """A JSON or YAML file (YAML is a superset of JSON)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh) if path.endswith((".yaml", ".yml")) else json.load(fh)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise FleetlensError(f"cannot read {path}: {exc}") from exc


def _suites(args: argparse.Namespace) -> int:
    with client(args) as c:
        if args.suites_command == "register":
            out = c.post("/v1/evaluation-suites", _load(args.file))
        elif args.suites_command == "show":
            out = c.get(f"/v1/evaluation-suites/{args.ref}")
        elif args.suites_command == "list":
            out = c.get("/v1/evaluation-suites")
            if not args.json:
                if not out["suites"]:
                    print("no evaluation suites registered (fleetlens eval suites register FILE)")
                for su in out["suites"]:
                    benches = ",".join(b["name"] for b in su["benchmarks"])
                    print(
                        f"{su['name']}@{su['version']}  benchmarks {benches}  "
                        f"gates {len(su.get('gates') or [])}"
                    )
                return 0
        else:
            raise FleetlensError("name a command: fleetlens eval suites register|list|show")
    print_json(out)
    return 0


def _triggers(args: argparse.Namespace) -> int:
    with client(args) as c:
        if args.triggers_command == "add":
            from ..api.evaluation_requests import TriggerBody

            adapter = {"adapter": _json_arg("--adapter", args.adapter)} if args.adapter else {}
            body = TriggerBody.model_construct(
                on=args.on,
                suite=args.suite,
                project=args.project,
                model_id=args.model,
                alias=args.alias,
                priority=args.priority,
                **adapter,
            )
            out = c.post("/v1/evaluation-triggers", _wire(body))
        elif args.triggers_command == "list":
            out = c.get("/v1/evaluation-triggers")
        else:
            raise FleetlensError("name a command: fleetlens eval triggers add|list")
    print_json(out)
    return 0


def _json_arg(flag: str, value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as exc:
        raise FleetlensError(f"{flag} is not JSON: {exc}") from exc


def _wire(body: BaseModel) -> Any:
    """A request body as the API takes it: the fields set, under their JSON keys."""
    return body.model_dump(by_alias=True, exclude_unset=True)


def lm_eval_request(
    task: str, adapter: str, shard_size: int = 50, no_cache: bool = False
) -> EvaluationBody:
    """An evaluation of one lm-evaluation-harness task file (read by the server, as the path
    names it here) on the model ``adapter`` (JSON) names."""
    import hashlib
    import os

    try:
        spec = json.loads(adapter)
        with open(task, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()[:12]
    except ValueError as exc:
        raise FleetlensError(f"--adapter is not JSON: {exc}") from exc
    except OSError as exc:
        raise FleetlensError(f"cannot read lm-eval task {task}: {exc}") from exc
    name = os.path.splitext(os.path.basename(task))[0]
    bench = {"name": name, "version": digest, "source": "lm_eval", "task": os.path.abspath(task)}
    from ..api.evaluation_requests import EvaluationBody

    return EvaluationBody.model_construct(
        adapter=spec,
        suite={"name": name, "version": digest, "benchmarks": [bench]},
        shard_size=shard_size,
        no_cache=no_cache,
    )


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
            preload=tuple(_json_arg("--preload-adapter", a) for a in args.preload_adapter or ()),
        )
    )
    try:
        worker.preload()
        print(f"worker {worker.worker_id}: polling", file=sys.stderr, flush=True)
        done = worker.run()
    except KeyboardInterrupt:
        done = worker.shards_done
    finally:
        worker.close()
    print(f"worker {worker.worker_id}: {done} shard(s) completed", file=sys.stderr)
    return 0


def _status(doc: Any) -> int:
    """An evaluation's state, progress and metrics (its answer ``doc``); 1 if it failed."""
    from ..api.evaluation_models import EvaluationOut

    e = decode(EvaluationOut, doc)
    p = e.progress
    done, total, shards, failed = (
        (p.examples_done, p.examples, p.shards_done, p.shards_failed) if p else (None,) * 4
    )
    print(
        f"{e.evaluation_id} {e.state} cache_hit={e.cache_hit} "
        f"examples {fmt(done)}/{fmt(total)} shards done {fmt(shards)} failed {fmt(failed)}"
    )
    for bench, ms in e.metrics.items():
        for name, v in ms.items():
            print(f"  {bench}/{name} = {v.mean:.4f} ± {v.stderr:.4f} (n={v.n})")
    return 0 if e.state != "FAILED" else 1


def cmd_eval(args: argparse.Namespace) -> int:
    cmd = args.eval_command
    if cmd == "worker":
        return _worker(args)
    if cmd == "suites":
        return _suites(args)
    if cmd == "triggers":
        return _triggers(args)
    if cmd not in ("submit", "lm-eval", "status", "gate", "promote"):
        raise FleetlensError(
            "name a command: fleetlens eval worker|submit|lm-eval|status|gate|promote|suites|"
            "triggers"
        )
    with client(args) as c:
        if cmd == "submit":
            out = c.post("/v1/evaluations", _load(args.request))
        elif cmd == "lm-eval":
            body = lm_eval_request(args.task, args.adapter, args.shard_size, args.no_cache)
            out = c.post("/v1/evaluations", _wire(body))
        elif cmd == "status":
            out = c.get(f"/v1/evaluations/{args.evaluation_id}")
        elif cmd == "gate":
            from ..api.evaluation_requests import GateBody

            gate = GateBody.model_construct(
                model_id=args.model,
                version=args.version,
                policies=_load(args.policies),
                baseline_alias=args.baseline,
            )
            out = c.post("/v1/gates", _wire(gate))
        else:
            from ..api.evaluation_requests import AliasBody

            move = AliasBody.model_construct(
                version=args.version,
                decision_id=args.decision or "",
                override_reason=args.override_reason or "",
            )
            out = c.post(f"/v1/models/{args.model}/aliases/{args.alias}", _wire(move))
    if cmd == "status" and not args.json:
        return _status(out)
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
    w.add_argument(
        "--preload-adapter",
        action="append",
        metavar="JSON",
        help="load this adapter (model) before the first lease; repeatable",
    )
    sm = s.add_parser("submit", help="queue an evaluation (JSON request file)")
    sm.add_argument(
        "request", help="JSON or YAML file: {modelId, modelVersion, adapter, suite|benchmarkSuite}"
    )
    le = s.add_parser("lm-eval", help="evaluate an lm-evaluation-harness task YAML")
    le.add_argument("task", help="task YAML (multiple_choice; read by the server)")
    le.add_argument("--adapter", required=True, help='JSON, e.g. {"kind": "hf", "path": DIR}')
    le.add_argument("--shard-size", type=int, default=50)
    le.add_argument("--no-cache", action="store_true", help="evaluate even if a result exists")
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
    su = s.add_parser("suites", help="named, versioned suites: register FILE | list | show NAME")
    sus = su.add_subparsers(dest="suites_command")
    sr = sus.add_parser("register", help="register a suite (YAML or JSON file)")
    sr.add_argument("file")
    sl = sus.add_parser("list", help="every suite, every version")
    ss = sus.add_parser("show", help="a suite: NAME (newest version) or NAME@VERSION")
    ss.add_argument("ref")
    tr = s.add_parser("triggers", help="policies that start evaluations: add | list")
    trs = tr.add_subparsers(dest="triggers_command")
    ta = trs.add_parser("add", help="evaluate new model versions or verified checkpoints")
    ta.add_argument("--on", required=True, choices=("model", "checkpoint", "alias"))
    ta.add_argument("--suite", required=True, help="NAME or NAME@VERSION")
    ta.add_argument("--project", default="", help="default: every project")
    ta.add_argument("--model", default="", help="default: any model")
    ta.add_argument("--alias", default="", help="with --on alias")
    ta.add_argument("--priority", default="P1")
    ta.add_argument("--adapter", help="JSON; strings may name {checkpointUri}, {runId}, ...")
    tl = trs.add_parser("list")
    for sp in (p, w, sm, le, st, g, pr, su, sr, sl, ss, tr, ta, tl):
        client_opts(sp)
    p.set_defaults(func=cmd_eval, eval_command=None)
