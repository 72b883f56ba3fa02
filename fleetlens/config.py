"""The server's configuration: one typed dataclass, resolved CLI > environment > file > default.

The environment is read here and nowhere else on the server side, and only when asked
(never at import). ``fleetlens config`` prints the resolved result.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import msgspec

from .errors import ConfigError

__all__ = ["DEFAULT_PORT", "ServerConfig"]

DEFAULT_PORT = 8480

_ENV = {
    "data_dir": "FLEETLENS_DATA",
    "host": "FLEETLENS_HOST",
    "port": "FLEETLENS_PORT",
    "clickhouse_url": "FLEETLENS_CLICKHOUSE",
    "database_url": "FLEETLENS_DATABASE_URL",
    "max_body_bytes": "FLEETLENS_MAX_BODY_BYTES",
    "max_inflight": "FLEETLENS_MAX_INFLIGHT",
    "max_queue_bytes": "FLEETLENS_MAX_QUEUE_BYTES",
    "queue_wait_s": "FLEETLENS_QUEUE_WAIT_S",
    "log_level": "FLEETLENS_LOG_LEVEL",
    "auth": "FLEETLENS_AUTH",
    "analysis_interval_s": "FLEETLENS_ANALYSIS_INTERVAL_S",
    "alertmanager_url": "FLEETLENS_ALERTMANAGER_URL",
    "webhook_url": "FLEETLENS_WEBHOOK_URL",
    "slack_url": "FLEETLENS_SLACK_URL",
    "public_url": "FLEETLENS_PUBLIC_URL",
    "alert_policy": "FLEETLENS_ALERT_POLICY",
    "remediation": "FLEETLENS_REMEDIATION",
    "actuators": "FLEETLENS_ACTUATORS",
    "hang_s": "FLEETLENS_HANG_S",
    "restart_cost_s": "FLEETLENS_RESTART_COST_S",
    "straggler_persist_s": "FLEETLENS_STRAGGLER_PERSIST_S",
}


def _default_data_dir(environ: Mapping[str, str]) -> str:
    base = environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "fleetlens")


@dataclass(frozen=True)
class ServerConfig:
    data_dir: str = ""
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    clickhouse_url: str = ""
    database_url: str = ""
    max_body_bytes: int = 64 << 20
    max_rows: int = 4_000_000
    max_inflight: int = 64
    max_queue_bytes: int = 512 << 20
    queue_wait_s: float = 2.0
    log_level: str = "warning"
    auth: str = "auto"  # auto: tokens required unless bound to loopback; required; off
    analysis_interval_s: float = 5.0
    alertmanager_url: str = ""
    webhook_url: str = ""
    slack_url: str = ""
    public_url: str = ""  # how users reach this server (links in notifications)
    alert_policy: str = ""  # YAML/JSON file of policy overrides
    remediation: str = "recommend"  # off | recommend | approve | automatic (docs/remediation.md)
    actuators: str = "torchrun"  # comma-separated: torchrun, slurm, kubernetes
    hang_s: float = 60.0  # a job with no rank progressing this long is hung
    restart_cost_s: float = 300.0  # a restart's cost until the run has measured one
    straggler_persist_s: float = 300.0  # a straggler is acted on once flagged this long

    @property
    def loopback(self) -> bool:
        if self.host in ("localhost", "ip6-localhost"):
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def auth_required(self) -> bool:
        return self.auth == "required" or (self.auth == "auto" and not self.loopback)

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or "sqlite:///" + os.path.join(self.data_dir, "metadata.db")

    @property
    def telemetry_dir(self) -> str:
        return os.path.join(self.data_dir, "telemetry")

    @classmethod
    def resolve(
        cls,
        cli: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        config_file: str | None = None,
    ) -> ServerConfig:
        """CLI values (None = not given) over FLEETLENS_* variables over a TOML file."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        path = config_file or environ.get("FLEETLENS_CONFIG")
        if path:
            try:
                with open(path, "rb") as fh:
                    loaded = msgspec.toml.decode(fh.read())
            except (OSError, msgspec.DecodeError) as exc:
                raise ConfigError(f"cannot read config file {path}: {exc}") from exc
            section = loaded.get("server", loaded)
            unknown = set(section) - {f.name for f in fields(cls)}
            if unknown:
                raise ConfigError(f"config file {path}: unknown keys {sorted(unknown)}")
            values.update(section)
        for name, var in _ENV.items():
            if var in environ and environ[var] != "":
                values[name] = environ[var]
        for name, value in (cli or {}).items():
            if value is not None:
                values[name] = value
        types = {f.name: f.type for f in fields(cls)}
        for name, value in list(values.items()):
            kind = {"int": int, "float": float}.get(str(types[name]))
            if kind is not None and not isinstance(value, kind):
                try:
                    values[name] = kind(value)
                except ValueError as exc:
                    want = "an integer" if kind is int else "a number"
                    raise ConfigError(f"{name} is {value!r}; expected {want}") from exc
        cfg = cls(**values)
        if not cfg.data_dir:
            cfg = dataclasses.replace(cfg, data_dir=_default_data_dir(environ))
        if not 0 < cfg.port < 65536:
            raise ConfigError(f"port is {cfg.port}; use 1-65535")
        if cfg.auth not in ("auto", "required", "off"):
            raise ConfigError(f"auth is {cfg.auth!r}; use auto, required or off")
        if cfg.auth == "off" and not cfg.loopback:
            raise ConfigError(
                f"refusing --auth off on {cfg.host}: without tokens anyone who can reach it "
                "reads and writes everything; bind to 127.0.0.1, or create tokens "
                "(fleetlens tokens create) and terminate TLS in front (docs/security.md)"
            )
        if cfg.analysis_interval_s <= 0:
            raise ConfigError(f"analysis_interval_s is {cfg.analysis_interval_s}; it must be > 0")
        if cfg.remediation not in ("off", "recommend", "approve", "automatic"):
            raise ConfigError(
                f"remediation is {cfg.remediation!r}; use off, recommend, approve or automatic"
            )
        if cfg.hang_s <= 0 or cfg.restart_cost_s <= 0 or cfg.straggler_persist_s < 0:
            raise ConfigError("hang_s and restart_cost_s must be > 0, straggler_persist_s >= 0")
        if cfg.max_inflight < 1:
            raise ConfigError(f"max_inflight is {cfg.max_inflight}; it must be >= 1")
        return cfg

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["database_url"] = self.resolved_database_url
        return d
