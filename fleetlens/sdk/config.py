"""Configuration of the training-side SDK, resolved once inside ``fleetlens.init``.

Precedence: explicit arguments > ``FLEETLENS_*`` variables > launcher variables (torchrun, Slurm)
> defaults. The environment is read only in :meth:`SDKConfig.resolve`, never at import, so a test
or a launcher can set variables after ``import fleetlens``. Values we cannot make sense of raise
:class:`~fleetlens.errors.ConfigError` naming the variable, the value and the fix: a wrong rank
would silently mis-attribute every record, so we refuse to guess.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .orphans import owner_digest
from .spool import default_spool_root

__all__ = ["SDKConfig"]

_MiB = 1024 * 1024
Agree = Callable[[str, Mapping[str, str]], tuple[str, str]]
"""Settles a run id among the job's ranks: (made-up id, environment) -> (id, how agreed)."""
AgreeAttempt = Callable[[int, int, Mapping[str, str]], int]
"""Settles an attempt's number among its ranks: (own restart count, world, environment) -> N."""
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class SDKConfig:
    """Everything the SDK needs; build it with :meth:`resolve` rather than by hand."""

    server: str = "http://127.0.0.1:8480"
    # The node relay: a URL or unix:PATH, "off", or "" to use one found at init (sdk/route.py).
    relay: str = ""
    token: str | None = None
    tenant: str = "default"
    project: str = "default"
    experiment_id: str = ""
    run_id: str = ""
    job_id: str = ""
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    node_id: str = ""
    gpu: int = -1
    launcher: str = "none"
    restart_count: int = 0
    enabled: bool = True
    spool_dir: str = ""
    spool_max_bytes: int = 256 * _MiB
    # Buffer caps per priority P0..P3, in buffered entries (one run.log call is one entry).
    buffer_caps: tuple[int, int, int, int] = (100_000, 200_000, 500_000, 50_000)
    flush_interval: float = 0.5
    # A heartbeat (step, phase, since when) every this many seconds, also while no step ends:
    # the server judges hangs by it (fleetlens.analysis.hangs). 0 turns it off.
    heartbeat_s: float = 10.0
    # The rank's memory (the device's and the process's, fleetlens.sdk.memory) every this many
    # seconds, as scalars of the step the training thread is at. 0 turns it off.
    memory_s: float = 5.0
    # The rank's log lines (Python logging, stdout and stderr) with their step, as ``log``
    # records (fleetlens.sdk.logs). FLEETLENS_LOGS=1 turns it on.
    capture_logs: bool = False
    # A few profiled steps when the server asks (a straggler and a healthy peer; fleetlens.torch
    # .capture), polled on the control channel. FLEETLENS_TRACE_CAPTURE=1 turns it on.
    trace_capture: bool = False
    max_batch_rows: int = 50_000
    send_timeout: float = 5.0
    compress: bool = True
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    exit_flush_timeout: float = 5.0
    signal_flush_timeout: float = 2.0
    install_signal_handler: bool = True
    # In a torch job of several ranks, tell each backward's compute from its wait for the others
    # (fleetlens.torch.auto). FLEETLENS_TORCH_SPLIT=0 turns it off.
    torch_split: bool = True
    config: dict[str, Any] = field(default_factory=dict, compare=False)
    # Launcher variables worth keeping with the job_start event (torchrun/Slurm ids, master).
    launcher_env: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def spool_owner(self) -> str:
        """Whose batches this run's spool holds, for a later process that adopts them once
        this one is gone (:mod:`fleetlens.sdk.orphans`)."""
        return owner_digest(self.server, self.token)

    @property
    def ctx(self) -> dict[str, str]:
        """Identifiers that travel once per batch; empty ones are left out."""
        pairs = (
            ("tenant", self.tenant),
            ("project", self.project),
            ("experiment_id", self.experiment_id),
            ("run_id", self.run_id),
            ("job_id", self.job_id),
        )
        return {k: v for k, v in pairs if v}

    @classmethod
    def resolve(
        cls,
        explicit: Mapping[str, Any],
        environ: Mapping[str, str],
        agree: Agree | None = None,
        agree_attempt: AgreeAttempt | None = None,
    ) -> SDKConfig:
        """Merge explicit arguments (None = not given), ``environ`` and defaults. ``agree``
        (:func:`fleetlens.sdk.agree.agree_run_id`) settles a run id the launcher did not name
        among the job's ranks, ``agree_attempt`` (:func:`~fleetlens.sdk.agree.agree_attempt`)
        the number of a torchrun attempt whose job id is not given."""
        return _Resolver(explicit, environ, agree, agree_attempt).resolve()


_FIELDS = {f.name for f in dataclasses.fields(SDKConfig)}

# FLEETLENS_* variable -> field, for the settings in seconds, with what the seconds are.
_ENV_SECONDS = (
    ("FLEETLENS_HEARTBEAT_S", "heartbeat_s", "between heartbeats, e.g. 10, or 0 to send none"),
    ("FLEETLENS_MEMORY_S", "memory_s", "between memory samples, e.g. 5, or 0 to sample none"),
    ("FLEETLENS_EXIT_FLUSH_S", "exit_flush_timeout", "finish() may wait to send, e.g. 5"),
)

# FLEETLENS_* variable -> field, for the plain string settings.
_ENV_STR = {
    "FLEETLENS_SERVER": "server",
    "FLEETLENS_RELAY": "relay",
    "FLEETLENS_TOKEN": "token",
    "FLEETLENS_TENANT": "tenant",
    "FLEETLENS_PROJECT": "project",
    "FLEETLENS_EXPERIMENT": "experiment_id",
    "FLEETLENS_SPOOL_DIR": "spool_dir",
    "FLEETLENS_NODE_ID": "node_id",
}


_LAUNCHER_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_NODEID",
    "SLURM_RESTART_COUNT",
    "SLURM_JOB_NAME",
    "SLURM_JOB_PARTITION",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_NAMESPACE",
    "CUDA_VISIBLE_DEVICES",
)


class _Resolver:
    def __init__(
        self,
        explicit: Mapping[str, Any],
        environ: Mapping[str, str],
        agree: Agree | None = None,
        agree_attempt: AgreeAttempt | None = None,
    ) -> None:
        self.agree, self.agree_attempt = agree, agree_attempt
        unknown = sorted(k for k, v in explicit.items() if v is not None and k not in _FIELDS)
        if unknown:
            raise ConfigError(
                f"unknown fleetlens setting(s) {unknown}; known settings: {sorted(_FIELDS)}"
            )
        self.explicit = {k: v for k, v in explicit.items() if v is not None}
        self.env = environ

    def _int_env(self, var: str, fix: str) -> int | None:
        raw = self.env.get(var)
        if raw is None or raw.strip() == "":
            return None
        try:
            return int(raw.strip())
        except ValueError:
            raise ConfigError(f"{var}={raw!r} is not an integer; {fix}") from None

    def _first_int(self, name: str, vars_: tuple[str, ...], fix: str) -> tuple[int | None, str]:
        """The explicit value or the first launcher variable set, with where it came from."""
        if name in self.explicit:
            value = self.explicit[name]
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name}={value!r} is not an integer; {fix}")
            return value, f"argument {name}"
        for var in vars_:
            got = self._int_env(var, fix)
            if got is not None:
                return got, var
        return None, name

    def resolve(self) -> SDKConfig:
        values: dict[str, Any] = {}
        for var, name in _ENV_STR.items():
            raw = self.env.get(var)
            if raw:
                values[name] = raw
        disabled = self.env.get("FLEETLENS_DISABLED")
        if disabled is not None:
            low = disabled.strip().lower()
            if low not in _TRUE | _FALSE:
                raise ConfigError(
                    f"FLEETLENS_DISABLED={disabled!r} is not a boolean; set it to 1 or 0"
                )
            values["enabled"] = low not in _TRUE
        split = self.env.get("FLEETLENS_TORCH_SPLIT")
        if split is not None:
            low = split.strip().lower()
            if low not in _TRUE | _FALSE:
                raise ConfigError(
                    f"FLEETLENS_TORCH_SPLIT={split!r} is not a boolean; set it to 1 or 0"
                )
            values["torch_split"] = low in _TRUE
        for var, name in (
            ("FLEETLENS_LOGS", "capture_logs"),
            ("FLEETLENS_TRACE_CAPTURE", "trace_capture"),
        ):
            got = self.env.get(var)
            if got is not None:
                low = got.strip().lower()
                if low not in _TRUE | _FALSE:
                    raise ConfigError(f"{var}={got!r} is not a boolean; set it to 1 or 0")
                values[name] = low in _TRUE
        spool_max = self._int_env(
            "FLEETLENS_SPOOL_MAX_BYTES", "set it to the spool size limit in bytes, e.g. 268435456"
        )
        if spool_max is not None:
            values["spool_max_bytes"] = spool_max
        for var, name, hint in _ENV_SECONDS:
            got = self.env.get(var, "").strip()
            if got:
                try:
                    values[name] = float(got)
                except ValueError:
                    raise ConfigError(
                        f"{var}={got!r} is not a number; set it to the seconds {hint}"
                    ) from None
        values.update(self._placement())
        values.update(self._identity(values))
        values.update(self.explicit)
        if "node_id" not in values:
            values["node_id"] = socket.gethostname()
        if "spool_dir" not in values:
            values["spool_dir"] = os.path.join(
                default_spool_root(self.env), f"{_safe(values['run_id'])}-{values['rank']}"
            )
        if "launcher_env" in self.explicit:
            raise ConfigError("launcher_env is read from the environment; it cannot be passed")
        if "config" in values:
            values["config"] = dict(values["config"])
        if "buffer_caps" in values:
            values["buffer_caps"] = tuple(values["buffer_caps"])
        cfg = SDKConfig(**values)
        _validate(cfg)
        return cfg

    def _placement(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        env = self.env
        if "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env):
            launcher = "torchrun"
        elif "SLURM_PROCID" in env or "SLURM_JOB_ID" in env:
            launcher = "slurm"
        elif "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
            launcher = "mpi"
        else:
            launcher = "none"
        out["launcher"] = launcher
        out["launcher_env"] = {k: env[k] for k in _LAUNCHER_VARS if k in env}
        world, world_src = self._first_int(
            "world_size",
            ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
            "set it to the number of ranks in the job (>= 1)",
        )
        rank, rank_src = self._first_int(
            "rank",
            ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"),
            "set it to the process's global rank (>= 0)",
        )
        local, local_src = self._first_int(
            "local_rank",
            ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"),
            "set it to the rank on this node (>= 0)",
        )
        world = 1 if world is None else world
        rank = 0 if rank is None else rank
        local = rank if local is None else local
        if world < 1:
            raise ConfigError(f"{world_src}={world} is not a valid world size; it must be >= 1")
        if rank < 0:
            raise ConfigError(f"{rank_src}={rank} is negative; ranks are >= 0")
        if rank >= world:
            raise ConfigError(
                f"{rank_src}={rank} is not below {world_src}={world}; ranks are "
                f"0..{world - 1}: check the launcher variables or pass rank= and world_size="
            )
        if local < 0:
            raise ConfigError(f"{local_src}={local} is negative; local ranks are >= 0")
        out.update(world_size=world, rank=rank, local_rank=local)
        gpu = self._int_env("FLEETLENS_GPU", "set it to the GPU index on the node, or -1")
        if gpu is None:
            gpu = local if env.get("CUDA_VISIBLE_DEVICES") else -1
        out["gpu"] = gpu
        return out

    def _identity(self, values: Mapping[str, Any]) -> dict[str, Any]:
        env = self.env
        run_id = self.explicit.get("run_id") or env.get("FLEETLENS_RUN_ID")
        if not run_id:
            elastic = env.get("TORCHELASTIC_RUN_ID", "")
            if elastic and elastic.lower() != "none":
                run_id = elastic
        if not run_id:
            run_id = env.get("SLURM_JOB_ID") or env.get("PMIX_NAMESPACE")
        world = self.explicit.get("world_size", values.get("world_size", 1))
        on = self.explicit.get("enabled", values.get("enabled", True))
        shared = bool(on) and isinstance(world, int) and world > 1  # ranks to agree with
        if not run_id:
            run_id = f"run-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
            if self.agree is not None and shared:
                run_id, _ = self.agree(run_id, env)
        restarts = None
        for var in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"):
            restarts = self._int_env(var, "it counts restarts of the job and must be >= 0")
            if restarts is not None:
                if restarts < 0:
                    raise ConfigError(f"{var}={restarts} is negative; restart counts are >= 0")
                break
        job_id = env.get("FLEETLENS_JOB_ID") or self.explicit.get("job_id")
        torchrun = var == "TORCHELASTIC_RESTART_COUNT" and restarts is not None
        if self.agree_attempt is not None and torchrun and shared and not job_id:
            # each torchrun agent counts its own restarts: the attempt's ranks agree on one
            restarts = self.agree_attempt(restarts or 0, world, env)
        restarts = restarts or 0
        job_id = job_id or f"{run_id}-a{restarts}"
        return {"run_id": str(run_id), "job_id": job_id, "restart_count": restarts}


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:120]


def _validate(cfg: SDKConfig) -> None:
    url = urllib.parse.urlsplit(cfg.server)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ConfigError(
            f"server={cfg.server!r} is not an http(s) URL; set FLEETLENS_SERVER or server= "
            "to e.g. http://collector:8480"
        )
    relay = cfg.relay.strip()
    if relay and relay.lower() not in _FALSE | {"off", "none"}:
        url = urllib.parse.urlsplit(relay)
        ok = relay.startswith("unix:/") or (url.scheme in ("http", "https") and url.hostname)
        if not ok:
            raise ConfigError(
                f"relay={cfg.relay!r} is neither an http(s) URL nor unix:/PATH; set "
                "FLEETLENS_RELAY to e.g. http://127.0.0.1:7787, unix:/run/fleetlens/relay.sock "
                "or off"
            )
    positive = {
        "flush_interval": cfg.flush_interval,
        "send_timeout": cfg.send_timeout,
        "backoff_base": cfg.backoff_base,
        "backoff_max": cfg.backoff_max,
        "max_batch_rows": cfg.max_batch_rows,
    }
    for name, value in positive.items():
        if not value > 0:
            raise ConfigError(f"{name}={value!r} must be > 0")
    if cfg.spool_max_bytes < 0:
        raise ConfigError(
            f"spool_max_bytes={cfg.spool_max_bytes} is negative; set FLEETLENS_SPOOL_MAX_BYTES "
            "(or spool_max_bytes=) to a size in bytes, 0 to disable the spool"
        )
    for name, value in (
        ("heartbeat_s", cfg.heartbeat_s),
        ("memory_s", cfg.memory_s),
        ("exit_flush_timeout", cfg.exit_flush_timeout),
        ("signal_flush_timeout", cfg.signal_flush_timeout),
    ):
        if not value >= 0:
            raise ConfigError(f"{name}={value!r} must be >= 0 seconds")
    if len(cfg.buffer_caps) != 4 or any(c < 0 for c in cfg.buffer_caps):
        raise ConfigError(
            f"buffer_caps={cfg.buffer_caps!r} must be four entry counts >= 0, for P0..P3"
        )
    if not cfg.run_id:
        raise ConfigError("run_id is empty; pass run_id= or set FLEETLENS_RUN_ID")
