"""The command line: ``fleetlens serve | demo | runs | run show | goodput | sim | tokens ...``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from .config import DEFAULT_PORT, ServerConfig
from .errors import FleetlensError

__all__ = ["COMMANDS", "main"]

COMMANDS = (
    "serve",
    "demo",
    "config",
    "runs",
    "run",
    "goodput",
    "fleet",
    "sim",
    "agent",
    "traces",
    "alerts",
    "remediations",
    "stragglers",
    "diagnose",
    "compare",
    "import",
    "lineage",
    "models",
    "eval",
    "tokens",
    "tenants",
)


def _server_url(args: argparse.Namespace) -> str:
    return str(
        args.server or os.environ.get("FLEETLENS_SERVER") or f"http://127.0.0.1:{DEFAULT_PORT}"
    ).rstrip("/")


def _get(args: argparse.Namespace, path: str, **params: Any) -> Any:
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    url = f"{_server_url(args)}{path}{'?' + query if query else ''}"
    return _send(args, urllib.request.Request(url, headers={"Accept": "application/json"}))


def _post(args: argparse.Namespace, path: str, body: Any = None) -> Any:
    """POST ``body`` as JSON (an empty body when None) to the server; the answer decoded."""
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(f"{_server_url(args)}{path}", data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    return _send(args, req)


def _send(args: argparse.Namespace, req: urllib.request.Request) -> Any:
    token = os.environ.get("FLEETLENS_TOKEN")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        raise FleetlensError(f"{req.full_url}: HTTP {exc.code}: {detail}") from exc
    except urllib.error.URLError as exc:
        raise FleetlensError(
            f"cannot reach the fleetlens server at {_server_url(args)} ({exc.reason}); "
            "start one with `fleetlens serve` or pass --server URL"
        ) from exc


def _server_config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig.resolve(
        {
            "data_dir": args.data,
            "host": args.host,
            "port": args.port,
            "clickhouse_url": args.clickhouse,
            "database_url": args.database_url,
            "auth": getattr(args, "auth", None),
            "alertmanager_url": getattr(args, "alertmanager_url", None),
            "webhook_url": getattr(args, "webhook_url", None),
            "slack_url": getattr(args, "slack_url", None),
            "alert_policy": getattr(args, "alert_policy", None),
            "public_url": getattr(args, "public_url", None),
            "remediation": getattr(args, "remediation", None),
            "actuators": getattr(args, "actuators", None),
        },
        config_file=args.config,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .api.app import create_app

    cfg = _server_config(args)
    print(
        f"fleetlens serving on http://{cfg.host}:{cfg.port}  data: {cfg.data_dir}  "
        f"API docs: http://{cfg.host}:{cfg.port}/docs",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(create_app(cfg), host=cfg.host, port=cfg.port, log_level=cfg.log_level)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    print(json.dumps(_server_config(args).as_dict(), indent=2))
    return 0


def _fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "-"
    return format(v, spec) if spec else str(v)


def cmd_runs(args: argparse.Namespace) -> int:
    data = _get(args, "/v1/runs", project=args.project, limit=args.limit)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    rows = data["runs"]
    print(f"{'RUN':<32} {'PROJECT':<16} {'STATUS':<9} {'STEP':>9} {'RANKS':>6} {'JOBS':>5}")
    for r in rows:
        print(
            f"{r['runId']:<32} {r['project'] or '-':<16} {r['status']:<9} "
            f"{r['lastStep']:>9} {r['worldSize']:>6} {r['jobs']:>5}"
        )
    if not rows:
        print("(no runs yet)")
    return 0


def cmd_run_show(args: argparse.Namespace) -> int:
    run = _get(args, f"/v1/runs/{urllib.parse.quote(args.run, safe='')}")
    ranks = _get(
        args,
        f"/v1/runs/{urllib.parse.quote(args.run, safe='')}/ranks",
        limit=args.top,
        sort="compute",
    )
    if args.json:
        print(json.dumps({"run": run, "ranks": ranks}, indent=2))
        return 0
    m = run.get("metrics", {})
    print(f"run {run['runId']}  project {run['project'] or '-'}  status {run['status']}")
    print(
        f"  step {_fmt(run.get('step'))}  tokens {_fmt(run.get('tokensProcessed'), ',')}  "
        f"ranks {run.get('worldSize')}  jobs {run.get('jobs')}"
    )
    print(
        f"  step time {_fmt(m.get('stepTimeMs'), '.1f')} ms (slowest rank, median of last "
        f"{run.get('window', {}).get('steps', 0)} steps)  tokens/s "
        f"{_fmt(m.get('tokensPerSecond'), ',.0f')}  loss {_fmt(m.get('loss'), '.4g')}"
    )
    if ranks["ranks"]:
        print(f"  slowest ranks by compute time, steps {ranks['fromStep']}-{ranks['toStep']}:")
        print(
            f"    {'RANK':>6} {'NODE':<20} {'GPU':>4} {'COMPUTE ms':>11} {'x MEDIAN':>9} "
            f"{'WAIT ms':>8} {'STEP ms':>8}"
        )
        for r in ranks["ranks"]:
            print(
                f"    {r['rank']:>6} {r['node'] or '-':<20} {_fmt(r['gpu']):>4} "
                f"{_fmt(r['computeMs'], '.1f'):>11} {_fmt(r['computeSlowdown'], '.3f'):>9} "
                f"{_fmt(r['commMs'], '.1f'):>8} {_fmt(r['stepTimeMs'], '.1f'):>8}"
            )
    return 0


def _access(args: argparse.Namespace) -> Any:
    """The access store of a local data directory (the operator's own commands)."""
    from .store.access import AccessStore
    from .store.metadata import MetadataStore

    cfg = _server_config(args)
    if not cfg.database_url:  # the first command on a fresh install creates its data directory
        os.makedirs(cfg.data_dir, exist_ok=True)
    return AccessStore(MetadataStore(cfg.resolved_database_url))


def cmd_tokens(args: argparse.Namespace) -> int:
    access = _access(args)
    if args.tokens_command == "create":
        plaintext, info = access.create_token(
            args.tenant, args.role, project=args.project, name=args.name
        )
        print(plaintext)
        print(
            f"token {info.id} ({info.prefix}...) role {info.role} tenant {info.tenant}"
            f"{' project ' + info.project if info.project else ''}: shown once, store it now",
            file=sys.stderr,
        )
    elif args.tokens_command == "list":
        from .store.scope import Scope

        for t in access.list_tokens(Scope(tenant=args.tenant, role="admin", actor="cli")):
            state = "revoked" if t.revoked_at else "active"
            print(f"{t.id:>5} {t.prefix}... {t.role:<8} {t.project or '*':<16} {state:<8} {t.name}")
    else:
        from .store.scope import Scope

        access.revoke_token(Scope(tenant=args.tenant, role="admin", actor="cli"), args.id)
        print(f"token {args.id} revoked")
    return 0


def cmd_tenants_quota(args: argparse.Namespace) -> int:
    from .store.scope import Scope

    values = {
        k: v
        for k, v in {
            "ingest_bytes_per_s": args.ingest_bytes_per_s,
            "stored_bytes": args.stored_bytes,
            "eval_shards_in_flight": args.eval_shards_in_flight,
        }.items()
        if v is not None
    }
    access = _access(args)
    scope = Scope(tenant=args.tenant, role="admin", actor="cli")
    quotas = access.set_quotas(scope, args.tenant, values) if values else access.quotas(args.tenant)
    print(json.dumps({"tenant": args.tenant, **quotas}, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetlens", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def server_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--data", help="data directory (default ~/.local/share/fleetlens)")
        sp.add_argument("--host", help="address to bind (default 127.0.0.1)")
        sp.add_argument("--port", type=int, help=f"port (default {DEFAULT_PORT})")
        sp.add_argument("--clickhouse", help="ClickHouse URL instead of the embedded chDB")
        sp.add_argument("--database-url", help="metadata database URL (default SQLite in --data)")
        sp.add_argument("--config", help="TOML config file ([server] table)")

    sp = sub.add_parser("serve", help="run the collector and API server")
    server_opts(sp)
    sp.add_argument(
        "--auth",
        choices=("auto", "required", "off"),
        help="tokens: auto = required unless bound to loopback (default)",
    )
    sp.add_argument("--alertmanager-url", help="send alerts to this Alertmanager (API v2)")
    sp.add_argument("--webhook-url", help="send alerts to this JSON webhook")
    sp.add_argument("--slack-url", help="send alerts to this Slack-compatible webhook")
    sp.add_argument("--alert-policy", help="YAML file of alert policy overrides")
    sp.add_argument("--public-url", help="how users reach this server (links in alerts)")
    sp.add_argument(
        "--remediation",
        choices=("off", "recommend", "approve", "automatic"),
        help="what to do when a finding justifies taking a node out (default recommend)",
    )
    sp.add_argument(
        "--actuators", help="who takes a node out: torchrun, slurm, kubernetes (comma-separated)"
    )
    sp.set_defaults(func=cmd_serve)
    from . import demo

    demo.add_parser(sub)

    sp = sub.add_parser("config", help="print the resolved server configuration")
    server_opts(sp)
    sp.set_defaults(func=cmd_config)

    def client_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--server", help="server URL (default $FLEETLENS_SERVER or loopback)")
        sp.add_argument("--json", action="store_true", help="print the API's JSON")

    sp = sub.add_parser("runs", help="list runs")
    client_opts(sp)
    sp.add_argument("--project")
    sp.add_argument("--limit", type=int, default=50)
    sp.set_defaults(func=cmd_runs)
    sp = sub.add_parser("run", help="one run")
    rsub = sp.add_subparsers(dest="run_command", required=True)
    show = rsub.add_parser("show", help="status, speed and slowest ranks of a run")
    show.add_argument("run")
    show.add_argument("--top", type=int, default=5, help="slowest ranks to show")
    client_opts(show)
    show.set_defaults(func=cmd_run_show)

    from . import detect_cli, goodput_cli, graph_cli
    from .agent import run as agent_run
    from .alerts import cli as alerts_cli
    from .evaluation import cli as eval_cli
    from .remediation import cli as remediation_cli
    from .sim import cli as sim_cli
    from .traces import cli as traces_cli

    goodput_cli.add_parsers(sub)
    sim_cli.add_parser(sub)
    agent_run.add_parser(sub)
    traces_cli.add_parser(sub)
    alerts_cli.add_parser(sub)
    remediation_cli.add_parser(sub)
    detect_cli.add_parsers(sub)
    graph_cli.add_parsers(sub)
    eval_cli.add_parser(sub)

    sp = sub.add_parser("tokens", help="create, list or revoke API tokens (on the data directory)")
    tsub = sp.add_subparsers(dest="tokens_command", required=True)
    create = tsub.add_parser("create", help="print a new token (shown once)")
    create.add_argument("--tenant", required=True)
    create.add_argument("--role", required=True, help="ingest, viewer, editor, admin, oncall")
    create.add_argument("--project", default="", help="limit the token to one project")
    create.add_argument("--name", default="", help="who or what holds it")
    lst = tsub.add_parser("list", help="the tenant's tokens")
    lst.add_argument("--tenant", required=True)
    revoke = tsub.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("--tenant", required=True)
    revoke.add_argument("id", type=int)
    for t in (create, lst, revoke):
        server_opts(t)
        t.set_defaults(func=cmd_tokens)

    sp = sub.add_parser("tenants", help="tenant administration (on the data directory)")
    tensub = sp.add_subparsers(dest="tenants_command", required=True)
    quota = tensub.add_parser("quota", help="show or set a tenant's quotas (0 = unlimited)")
    quota.add_argument("tenant")
    quota.add_argument("--ingest-bytes-per-s", type=int)
    quota.add_argument("--stored-bytes", type=int)
    quota.add_argument("--eval-shards-in-flight", type=int)
    server_opts(quota)
    quota.set_defaults(func=cmd_tenants_quota)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except FleetlensError as exc:
        print(f"fleetlens: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
