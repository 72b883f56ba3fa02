"""``fleetlens tokens create|list|revoke`` and ``fleetlens tenants quota``: on the data directory.

These are the operator's own commands: they open the metadata store of ``--data`` (or
``--database-url``) directly, so the first admin token can be made before any server runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._common import access_store, server_opts
from ._output import Table, print_json

__all__ = ["add_parsers", "cmd_tenants_quota", "cmd_tokens"]


def _admin(tenant: str) -> Any:
    from ..store.scope import Scope

    return Scope(tenant=tenant, role="admin", actor="cli")


def cmd_tokens(args: argparse.Namespace) -> int:
    access = access_store(args)
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
        tokens = access.list_tokens(_admin(args.tenant))
        if args.json:
            from ..api.admin_models import TokenOut

            print_json([TokenOut.of(t).model_dump(mode="json", by_alias=True) for t in tokens])
            return 0
        t = Table(("", ">5"), ("", ""), ("", "<8"), ("", "<16"), ("", "<8"), ("", ""))
        for tok in tokens:
            state = "revoked" if tok.revoked_at else "active"
            print(t.row(tok.id, f"{tok.prefix}...", tok.role, tok.project or "*", state, tok.name))
    else:
        access.revoke_token(_admin(args.tenant), args.id)
        print(f"token {args.id} revoked")
    return 0


def cmd_tenants_quota(args: argparse.Namespace) -> int:
    values = {
        k: v
        for k, v in {
            "ingest_bytes_per_s": args.ingest_bytes_per_s,
            "stored_bytes": args.stored_bytes,
            "eval_shards_in_flight": args.eval_shards_in_flight,
        }.items()
        if v is not None
    }
    access = access_store(args)
    scope = _admin(args.tenant)
    quotas = access.set_quotas(scope, args.tenant, values) if values else access.quotas(args.tenant)
    print_json({"tenant": args.tenant, **quotas})
    return 0


def add_parsers(sub: Any) -> None:
    """Add ``tokens`` and ``tenants`` to the CLI's subparsers."""
    sp = sub.add_parser("tokens", help="create, list or revoke API tokens (on the data directory)")
    tsub = sp.add_subparsers(dest="tokens_command", required=True)
    create = tsub.add_parser("create", help="print a new token (shown once)")
    create.add_argument("--tenant", required=True)
    create.add_argument("--role", required=True, help="ingest, viewer, editor, admin, oncall")
    create.add_argument("--project", default="", help="limit the token to one project")
    create.add_argument("--name", default="", help="who or what holds it")
    lst = tsub.add_parser("list", help="the tenant's tokens")
    lst.add_argument("--tenant", required=True)
    lst.add_argument("--json", action="store_true", help="print the tokens as JSON")
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
