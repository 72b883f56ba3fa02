"""``init``: settings resolved, the run id agreed among the ranks, the :class:`Run` started
(or a :class:`NullRun` when disabled, which costs nothing)."""

from __future__ import annotations

import os
import sys
from typing import Any

from .agree import agree_attempt, agree_run_id
from .config import SDKConfig
from .null import NullRun
from .run import Run
from .transport import Transport

__all__ = ["init"]


def init(
    project: str | None = None,
    run_id: str | None = None,
    server: str | None = None,
    tenant: str | None = None,
    experiment_id: str | None = None,
    job_id: str | None = None,
    config: dict[str, Any] | None = None,
    token: str | None = None,
    enabled: bool | None = None,
    spool_dir: str | None = None,
    *,
    transport: Transport | None = None,
    dataset: str | dict[str, Any] | None = None,
    code: str | dict[str, Any] | None = None,
    **more_cfg: Any,
) -> Run:
    """Start recording this process's part of a run; raises ConfigError on bad settings.

    Explicit arguments beat ``FLEETLENS_*`` variables, which beat launcher variables (torchrun,
    Slurm), which beat defaults. ``more_cfg`` takes any other :class:`SDKConfig` field.
    ``dataset`` (``"name:version"`` or ``{name, version, content_hash, shards}``) and ``code``
    (a commit, or ``{repo, commit, dirty}``) travel with the job_start event into the run graph.
    """
    explicit: dict[str, Any] = {
        "project": project,
        "run_id": run_id,
        "server": server,
        "tenant": tenant,
        "experiment_id": experiment_id,
        "job_id": job_id,
        "config": config,
        "token": token,
        "enabled": enabled,
        "spool_dir": spool_dir,
        **more_cfg,
    }
    cfg = SDKConfig.resolve(explicit, os.environ, agree_run_id, agree_attempt)
    if not cfg.enabled:
        return NullRun(cfg)
    lineage: dict[str, Any] = {}
    if dataset is not None:
        lineage["dataset"] = dataset
    if code is not None:
        lineage["code"] = code
    run = Run(cfg, transport, lineage=lineage)
    if cfg.torch_split and cfg.world_size > 1 and "torch" in sys.modules:
        try:  # a torch job: tell its ranks' compute from their waiting (fleetlens.torch.auto)
            from ..torch.auto import install

            run._watch = install(run)
        except Exception:
            run._internal_error()
    if cfg.trace_capture and "torch" in sys.modules:
        try:  # profile a few steps when the server asks (fleetlens.torch.capture)
            from ..torch.capture import ensure_capture

            ensure_capture(run)
        except Exception:
            run._internal_error()
    return run
