"""The server's configuration: typed sections per component, resolved CLI > environment > file >
default.

The environment is read here and nowhere else on the server side, and only when asked
(never at import). ``fleetlens config show`` prints the resolved result.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import msgspec

from .errors import ConfigError
from .schema import KINDS

__all__ = [
    "DEFAULT_PORT",
    "SECTIONS",
    "AlertsConfig",
    "AnalyzerConfig",
    "CollectorConfig",
    "MonitorConfig",
    "RemediationConfig",
    "RetentionConfig",
    "ServerConfig",
]

DEFAULT_PORT = 8480


@dataclass(frozen=True)
class CollectorConfig:
    """``[collector]``: what one request may carry and how many may wait (docs/architecture.md).

    ``max_world_size`` bounds ranks and declared world sizes (the largest jobs run ~100k GPUs;
    the monitoring pass's memory is bounded by it); ``max_decoded_bytes`` the decompressed body
    (JSON: a quarter of it); ``decode_slots`` how many batches are decoded and inserted at once;
    ``commit_linger_s`` how long, while requests keep arriving, the group commit gathers them
    into one insert (:mod:`fleetlens.collector.commit`); ``max_inflight`` the requests read,
    decoded or waiting for their insert at once (a second of a busy fleet under the linger);
    ``max_future_s`` how far ahead of the server's clock a record's time may be (after skew
    correction; a day, as the simulator played at full speed runs ahead of its nominal end by
    the time its faults add); ``skew_tolerance_s`` the clock skew above which a batch's times
    are corrected (when the skew is certain) or flagged; ``max_request_rate`` the ingest requests a
    second the server paces its senders to (:mod:`fleetlens.collector.pacing`); ``body_grace_s``
    how long an upload's body may take, plus a second per MiB received, before it is cut off with
    408 (:mod:`fleetlens.api.bodies`); ``max_json_body_bytes`` the body of every other route (the
    JSON API's: :mod:`fleetlens.api.body_limit`); ``header_timeout_s`` how long a request's
    headers may take before the connection is answered 408 and closed
    (:mod:`fleetlens.api.http_protocol`); ``min_free_bytes`` the space kept free in the data
    directory: below it ingest is refused with 503 and Retry-After (:mod:`.collector.space`);
    ``max_trace_file_bytes`` a profiler trace file kept for Perfetto (gzip-compressed, streamed
    to disk: :mod:`fleetlens.traces.files`)."""

    max_body_bytes: int = 64 << 20
    max_json_body_bytes: int = 16 << 20
    max_rows: int = 4_000_000
    max_inflight: int = 4096
    max_queue_bytes: int = 512 << 20
    queue_wait_s: float = 2.0
    max_decoded_bytes: int = 256 << 20
    max_world_size: int = 131_072
    decode_slots: int = 2
    commit_linger_s: float = 0.5
    max_future_s: float = 86_400.0
    skew_tolerance_s: float = 5.0
    max_request_rate: float = 400.0
    body_grace_s: float = 30.0
    header_timeout_s: float = 10.0
    min_free_bytes: int = 256 << 20
    max_trace_file_bytes: int = 2 << 30


@dataclass(frozen=True)
class MonitorConfig:
    """``[monitor]``: the monitoring pass (analysis, alerts, remediation), which runs it reads."""

    interval_s: float = 5.0
    active_s: float = 3600.0  # runs seen within this long are evaluated
    goodput_every_s: float = 60.0  # a goodput sample per run at most this often
    goodput_window_s: float = 1800.0
    max_runs: int = 500


@dataclass(frozen=True)
class AnalyzerConfig:
    """``[analyzer]``: how much detection reads per pass, and its rules' thresholds. The hang
    rule (``hang_k`` x the recent step time, at least ``hang_floor_s``) is the one the alerts and
    remediation use too."""

    max_runs: int = 20
    max_rank_steps: int = 2_000_000
    max_steps: int = 2_000
    block_steps: int = 50
    hang_k: float = 10.0
    hang_floor_s: float = 60.0
    compute_min_shift: float = 0.03
    network_min_shift: float = 0.06
    rack_peer_shift: float = 0.05
    stage_min_excess: float = 0.05  # a pipeline stage this much over the median stage
    batch_min_spread: float = 0.03  # replicas' batch cost varying this much (std) step to step
    memory_warn_steps: float = 1000.0  # a rank's memory climbing to its limit within this many
    memory_min_rise: float = 0.05  # steps, having risen this share of the limit: memory_climb
    # Triggered trace capture (fleetlens.services.captures): profiled steps asked of a
    # straggler and a healthy peer in jobs that offer it (0: never ask), after this many
    # warm-up steps; at most one capture a run every capture_gap_s; traces not in within
    # capture_timeout_s of the request expire it.
    capture_steps: int = 3
    capture_warmup: int = 1
    capture_gap_s: float = 900.0
    capture_timeout_s: float = 300.0
    # A run slower than its workload's fleet baseline by more than this share (and 3 MADs of
    # the baseline): a <tier>_regression finding, one per tier of fleetlens.analysis
    # .regression (program, mfu, scaling, startup, recovery, checkpoint, allocation).
    regression_tolerance: float = 0.1
    regression_every_s: float = 60.0  # each active run judged at most this often
    # A device sample of the fault that ended an attempt (an Xid of a GPU off the bus) may be
    # stamped this long after the attempt's end, and arrive as long again after that: DCGM
    # samples every 10-30 s (dcgm-exporter -c); raise it where samples come later (a relay, a
    # longer scrape interval).
    device_lag_s: float = 30.0


@dataclass(frozen=True)
class AlertsConfig:
    """``[alerts]``: where alerts go, the policy overrides, and the server's public URL."""

    alertmanager_url: str = ""
    webhook_url: str = ""
    slack_url: str = ""
    public_url: str = ""  # how users reach this server (links in notifications)
    policy: str = ""  # YAML/JSON file of policy overrides


@dataclass(frozen=True)
class RemediationConfig:
    """``[remediation]``: auto-cordon (docs/remediation.md)."""

    mode: str = "recommend"  # off | recommend | approve | automatic
    actuators: str = "torchrun"  # comma-separated: torchrun, slurm, kubernetes
    restart_cost_s: float = 300.0  # a restart's cost until the run has measured one
    straggler_persist_s: float = 300.0  # a straggler is acted on once flagged this long


@dataclass(frozen=True)
class RetentionConfig:
    """``[retention]``: how long telemetry is kept, in days after a row is stored or its own
    time, whichever is later (docs/architecture.md). 0 keeps it forever.

    ``raw_days`` applies to the per-rank tables (steps, scalars, collectives, GPU, node and
    trace samples), ``rollup_days`` to the 10 s / 1 min rollups; ``tables`` overrides either
    per table: ``"steps=14,gpu_samples=7,events=90,rollups=730"`` (a table or kind name, or
    ``raw`` / ``rollups``). Events, placement and scheduler tables are kept forever unless named
    there; preserved failure windows are never expired."""

    raw_days: int = 30
    rollup_days: int = 365
    tables: str = ""

    def overrides(self) -> dict[str, int]:
        """``tables`` parsed: name -> days, the names as given (validated by the store)."""
        out: dict[str, int] = {}
        for item in self.tables.replace(";", ",").split(","):
            if not item.strip():
                continue
            name, sep, days = item.partition("=")
            try:
                n = int(days.strip()) if sep else -1
            except ValueError:
                n = -1
            if n < 0 or not name.strip():
                raise ConfigError(
                    f"retention.tables item {item.strip()!r} is not NAME=DAYS; write e.g. "
                    "steps=14,gpu_samples=7,rollups=730 (0 keeps a table forever)"
                )
            name = name.strip()
            known = {k.name for k in KINDS.values()} | {k.table for k in KINDS.values()}
            if name not in known | {"raw", "rollups"}:
                raise ConfigError(
                    f"retention.tables names {name!r}; use a table or kind ("
                    f"{', '.join(sorted(k.table for k in KINDS.values()))}), raw or rollups "
                    "(preserved failure windows are never expired)"
                )
            out[name] = n
        return out


SECTIONS: dict[str, type] = {
    "collector": CollectorConfig,
    "monitor": MonitorConfig,
    "analyzer": AnalyzerConfig,
    "alerts": AlertsConfig,
    "remediation": RemediationConfig,
    "retention": RetentionConfig,
}

# Each setting a flag or a variable can set: its name (the CLI's and the environment's) ->
# (section, field); "" is the top-level [server] table.
_FLAT: dict[str, tuple[str, str]] = {
    "data_dir": ("", "data_dir"),
    "host": ("", "host"),
    "port": ("", "port"),
    "clickhouse_url": ("", "clickhouse_url"),
    "database_url": ("", "database_url"),
    "log_level": ("", "log_level"),
    "auth": ("", "auth"),
    "readable_paths": ("", "readable_paths"),
    "advertise_url": ("", "advertise_url"),
    "max_body_bytes": ("collector", "max_body_bytes"),
    "max_json_body_bytes": ("collector", "max_json_body_bytes"),
    "max_trace_file_bytes": ("collector", "max_trace_file_bytes"),
    "max_rows": ("collector", "max_rows"),
    "max_inflight": ("collector", "max_inflight"),
    "max_queue_bytes": ("collector", "max_queue_bytes"),
    "queue_wait_s": ("collector", "queue_wait_s"),
    "max_decoded_bytes": ("collector", "max_decoded_bytes"),
    "max_world_size": ("collector", "max_world_size"),
    "decode_slots": ("collector", "decode_slots"),
    "commit_linger_s": ("collector", "commit_linger_s"),
    "max_request_rate": ("collector", "max_request_rate"),
    "body_grace_s": ("collector", "body_grace_s"),
    "header_timeout_s": ("collector", "header_timeout_s"),
    "min_free_bytes": ("collector", "min_free_bytes"),
    "max_future_s": ("collector", "max_future_s"),
    "analysis_interval_s": ("monitor", "interval_s"),
    "hang_s": ("analyzer", "hang_floor_s"),
    "capture_steps": ("analyzer", "capture_steps"),
    "regression_every_s": ("analyzer", "regression_every_s"),
    "device_lag_s": ("analyzer", "device_lag_s"),
    "alertmanager_url": ("alerts", "alertmanager_url"),
    "webhook_url": ("alerts", "webhook_url"),
    "slack_url": ("alerts", "slack_url"),
    "public_url": ("alerts", "public_url"),
    "alert_policy": ("alerts", "policy"),
    "remediation": ("remediation", "mode"),
    "actuators": ("remediation", "actuators"),
    "restart_cost_s": ("remediation", "restart_cost_s"),
    "straggler_persist_s": ("remediation", "straggler_persist_s"),
    "retention": ("retention", "tables"),
    "retention_days": ("retention", "raw_days"),
    "rollup_retention_days": ("retention", "rollup_days"),
}
_ENV = {name: "FLEETLENS_" + name.upper() for name in _FLAT}
_ENV.update(data_dir="FLEETLENS_DATA", clickhouse_url="FLEETLENS_CLICKHOUSE")


def _default_data_dir(environ: Mapping[str, str]) -> str:
    base = environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "fleetlens")


def _typed(where: str, value: Any, kind: Any) -> Any:
    """``value`` (a string from the environment or a flag, or a TOML value) as ``kind``."""
    kind = {"int": int, "float": float, "str": str}.get(str(kind), kind)
    if (kind in (int, float) and not isinstance(value, kind)) or kind is str:
        try:
            return kind(value)
        except (TypeError, ValueError) as exc:
            want = {int: "an integer", float: "a number"}.get(kind, "a string")
            raise ConfigError(f"{where} is {value!r}; expected {want}") from exc
    return value


@dataclass(frozen=True)
class ServerConfig:
    """The server's configuration: the ``[server]`` table's settings and one typed section per
    component, resolved by :meth:`resolve` (``fleetlens config show`` prints it)."""

    data_dir: str = ""
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    clickhouse_url: str = ""
    database_url: str = ""
    log_level: str = "warning"
    auth: str = "auto"  # auto: tokens required unless bound to loopback; required; off
    # Directories (os.pathsep-separated) besides DATA/artifacts whose files the server may read
    # to checksum an artifact or verify a drained job's checkpoint (a shared file system).
    readable_paths: str = ""
    # How the other servers reach this one (they forward a job's control polls to the leader);
    # default http://HOST:PORT, or the machine's hostname when bound to every address.
    advertise_url: str = ""
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    analyzer: AnalyzerConfig = field(default_factory=AnalyzerConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    remediation: RemediationConfig = field(default_factory=RemediationConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)

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
    def readable_roots(self) -> tuple[str, ...]:
        """Where the server may open local files: DATA/artifacts and ``readable_paths``."""
        extra = [p for p in self.readable_paths.split(os.pathsep) if p.strip()]
        return (os.path.join(self.data_dir, "artifacts"), *extra)

    @property
    def advertised_url(self) -> str:
        """The URL the other servers of a deployment reach this one at."""
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        host = self.host
        if host in ("", "0.0.0.0", "::"):
            host = socket.gethostname()
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

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
        """CLI values (None = not given) over ``FLEETLENS_*`` variables over a TOML file
        (``[server]`` and one table per section) over the defaults; the environment is read
        here and nowhere else on the server side."""
        environ = os.environ if environ is None else environ
        values: dict[str, dict[str, Any]] = {"": {}, **{name: {} for name in SECTIONS}}
        path = config_file or environ.get("FLEETLENS_CONFIG")
        if path:
            _read_file(path, values)
        for name, var in _ENV.items():
            if environ.get(var, "") != "":
                section, key = _FLAT[name]
                values[section][key] = environ[var]
        for name, value in (cli or {}).items():
            if value is not None:
                if name not in _FLAT:
                    raise ConfigError(f"unknown setting {name!r}; known: {sorted(_FLAT)}")
                section, key = _FLAT[name]
                values[section][key] = value
        top = {f.name: f for f in fields(cls) if f.name not in SECTIONS}
        kwargs: dict[str, Any] = {k: _typed(k, v, top[k].type) for k, v in values[""].items()}
        for name, section_cls in SECTIONS.items():
            types = {f.name: f.type for f in fields(section_cls)}
            kwargs[name] = section_cls(
                **{k: _typed(f"{name}.{k}", v, types[k]) for k, v in values[name].items()}
            )
        cfg = cls(**kwargs)
        if not cfg.data_dir:
            cfg = dataclasses.replace(cfg, data_dir=_default_data_dir(environ))
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if not 0 < self.port < 65536:
            raise ConfigError(f"port is {self.port}; use 1-65535")
        if self.auth not in ("auto", "required", "off"):
            raise ConfigError(f"auth is {self.auth!r}; use auto, required or off")
        if self.auth == "off" and not self.loopback:
            raise ConfigError(
                f"refusing --auth off on {self.host}: without tokens anyone who can reach it "
                "reads and writes everything; bind to 127.0.0.1, or create tokens "
                "(fleetlens tokens create) and terminate TLS in front (docs/security.md)"
            )
        if self.advertise_url and not self.advertise_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"advertise_url is {self.advertise_url!r}; use http://HOST:PORT (how the other "
                "servers reach this one)"
            )
        if self.monitor.interval_s <= 0:
            raise ConfigError(f"monitor.interval_s is {self.monitor.interval_s}; it must be > 0")
        r = self.remediation
        if r.mode not in ("off", "recommend", "approve", "automatic"):
            raise ConfigError(
                f"remediation.mode is {r.mode!r}; use off, recommend, approve or automatic"
            )
        if self.analyzer.hang_floor_s <= 0 or r.restart_cost_s <= 0 or r.straggler_persist_s < 0:
            raise ConfigError(
                "analyzer.hang_floor_s and remediation.restart_cost_s must be > 0, "
                "remediation.straggler_persist_s >= 0"
            )
        c = self.collector
        if c.max_inflight < 1 or c.decode_slots < 1:
            raise ConfigError(
                f"collector.max_inflight is {c.max_inflight} and collector.decode_slots "
                f"{c.decode_slots}; both must be >= 1"
            )
        if not 1 <= c.max_world_size <= 1 << 24 or c.max_future_s < 0:
            raise ConfigError(
                f"collector.max_world_size is {c.max_world_size} (use 1..{1 << 24}) and "
                f"collector.max_future_s {c.max_future_s} (use >= 0)"
            )
        if not c.body_grace_s > 0:
            raise ConfigError(f"collector.body_grace_s is {c.body_grace_s}; it must be > 0")
        if not 0 <= c.commit_linger_s <= 10:  # (NaN fails it too)
            raise ConfigError(
                f"collector.commit_linger_s is {c.commit_linger_s}; use 0..10 seconds"
            )

        t = self.retention
        if t.raw_days < 0 or t.rollup_days < 0:
            raise ConfigError(
                f"retention.raw_days is {t.raw_days} and retention.rollup_days {t.rollup_days}; "
                "use >= 0 (0 keeps rows forever)"
            )
        t.overrides()  # refuses a malformed list; names are checked where the tables are known

    def as_dict(self) -> dict[str, Any]:
        """The resolved configuration, by section (``fleetlens config show``)."""
        d = dataclasses.asdict(self)
        d["database_url"] = self.resolved_database_url
        return d


def _read_file(path: str, values: dict[str, dict[str, Any]]) -> None:
    try:
        with open(path, "rb") as fh:
            loaded = msgspec.toml.decode(fh.read())
    except (OSError, msgspec.DecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    unknown_tables = set(loaded) - {"server", *SECTIONS}
    if unknown_tables:
        raise ConfigError(
            f"config file {path}: unknown tables {sorted(unknown_tables)}; "
            f"known: server, {', '.join(SECTIONS)}"
        )
    top = {f.name for f in fields(ServerConfig)} - set(SECTIONS)
    for key, value in dict(loaded.get("server", {})).items():
        if key not in top:
            hint = f" (it is {'.'.join(_FLAT[key])} now)" if key in _FLAT else ""
            raise ConfigError(f"config file {path}: unknown key server.{key}{hint}")
        values[""][key] = value
    for name, section_cls in SECTIONS.items():
        known = {f.name for f in fields(section_cls)}
        for key, value in dict(loaded.get(name, {})).items():
            if key not in known:
                raise ConfigError(
                    f"config file {path}: unknown key {name}.{key}; known: {sorted(known)}"
                )
            values[name][key] = value
