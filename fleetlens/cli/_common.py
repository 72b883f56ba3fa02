"""Options shared by the CLI's commands, and the one place a command gets its client."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from ..client import Client
from ..config import DEFAULT_PORT, ServerConfig

if TYPE_CHECKING:  # the models are imported where a command decodes (pydantic is not cheap)
    from pydantic import BaseModel

__all__ = [
    "access_store",
    "client",
    "client_opts",
    "decode",
    "exit_past_engine",
    "query",
    "server_config",
    "server_opts",
]

M = TypeVar("M", bound="BaseModel")


def exit_past_engine(code: int) -> NoReturn:
    """End a command that ran the embedded store (chDB) in this process, once it has stopped
    its server and closed its stores: flush the output and leave with ``os._exit``.

    chDB's engine keeps process-wide thread pools (background merges) that no API stops
    (chdb-io/chdb-core#181); at interpreter exit its static destructors run while those threads
    still work, and the process dies of SIGSEGV now and then (chdb-core#177): ``fleetlens
    demo`` did after Ctrl-C. Everything worth keeping is written by then (the stores are
    closed), so the C library's exit handlers are skipped rather than raced."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing left to say
            stream.flush()
    os._exit(code)


def client_opts(sp: argparse.ArgumentParser, json: bool = True) -> None:
    """``--server`` and ``--token`` (and ``--json`` on a read command): every command that
    talks to a server takes them here, and :func:`client` hands them to the one client."""
    sp.add_argument("--server", help="server URL (default $FLEETLENS_SERVER or loopback)")
    sp.add_argument("--token", help="API token (default $FLEETLENS_TOKEN)")
    if json:
        sp.add_argument("--json", action="store_true", help="print the API's JSON")


def client(args: argparse.Namespace, timeout: float = 60.0) -> Client:
    """The command's client: ``--server`` / ``--token``, else the client's own resolution
    (``$FLEETLENS_SERVER`` / ``$FLEETLENS_TOKEN``)."""
    return Client(getattr(args, "server", None), getattr(args, "token", None), timeout=timeout)


def decode(model: type[M], doc: Any) -> M:
    """The server's answer ``doc`` (its JSON, decoded) as the route's response model ``model``
    (:mod:`fleetlens.api.models`): snake_case attributes for the camelCase keys.

    Keys the model does not know are ignored, at every depth, so that the CLI also reads a newer
    server's answers (the models themselves refuse them: that is the server's contract test).
    A command prints ``doc`` itself for ``--json``, never the model dumped again."""
    return model.model_validate(doc, extra="ignore")


def query(**params: Any) -> dict[str, Any]:
    """A route's query parameters named in snake_case, as the API spells them (camelCase, as
    its models' aliases); those that are None left out."""
    from pydantic.alias_generators import to_camel

    return {to_camel(k): v for k, v in params.items() if v is not None}


def server_opts(sp: argparse.ArgumentParser) -> None:
    """The options of a command that works on the server's configuration or data directory."""
    sp.add_argument("--data", help="data directory (default ~/.local/share/fleetlens)")
    sp.add_argument("--host", help="address to bind (default 127.0.0.1)")
    sp.add_argument("--port", type=int, help=f"port (default {DEFAULT_PORT})")
    sp.add_argument("--clickhouse", help="ClickHouse URL instead of the embedded chDB")
    sp.add_argument("--database-url", help="metadata database URL (default SQLite in --data)")
    sp.add_argument(
        "--retention",
        metavar="TABLE=DAYS,...",
        help="days telemetry is kept, per table or kind, raw (per-rank tables, default 30) or "
        "rollups (default 365); 0 keeps forever: e.g. raw=14,gpu_samples=7,events=90",
    )
    sp.add_argument(
        "--config",
        help="TOML config file: [server], [collector], [monitor], [analyzer], [alerts], "
        "[remediation], [retention] tables (fleetlens config show prints one)",
    )


def server_config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig.resolve(
        {
            "data_dir": args.data,
            "host": args.host,
            "port": args.port,
            "clickhouse_url": args.clickhouse,
            "database_url": args.database_url,
            "auth": getattr(args, "auth", None),
            "readable_paths": getattr(args, "readable_paths", None),
            "advertise_url": getattr(args, "advertise_url", None),
            "alertmanager_url": getattr(args, "alertmanager_url", None),
            "webhook_url": getattr(args, "webhook_url", None),
            "slack_url": getattr(args, "slack_url", None),
            "alert_policy": getattr(args, "alert_policy", None),
            "public_url": getattr(args, "public_url", None),
            "remediation": getattr(args, "remediation", None),
            "actuators": getattr(args, "actuators", None),
            "retention": getattr(args, "retention", None),
        },
        config_file=args.config,
    )


def access_store(args: argparse.Namespace) -> Any:
    """The access store of a local data directory (the operator's own commands)."""
    from ..store.access import AccessStore
    from ..store.metadata import MetadataStore

    cfg = server_config(args)
    if not cfg.database_url:  # the first command on a fresh install creates its data directory
        os.makedirs(cfg.data_dir, exist_ok=True)
    return AccessStore(MetadataStore(cfg.resolved_database_url))
