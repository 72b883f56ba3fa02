"""Hugging Face ``Trainer`` state (``trainer_state.json``) -> an :class:`ImportedRun`.

``log_history`` holds the training logs (``loss``, ``learning_rate``, ``grad_norm`` every
``logging_steps``), the evaluations (``eval_loss`` and other ``eval_*``) and a final summary
(``train_runtime``). The file has no per-step clock: every step gets the run's mean step time
(``train_runtime / global_step``) and times follow from ``start`` (``clock == "synthetic"``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .episodes import settle
from .runlog import Attempt, ImportedRun

__all__ = ["parse_trainer_state", "read_hf_trainer"]

_NAMES = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm", "eval_loss": "val_loss"}
_CONFIG = (
    "train_batch_size",
    "max_steps",
    "num_train_epochs",
    "logging_steps",
    "eval_steps",
    "save_steps",
    "best_model_checkpoint",
    "best_metric",
)


def parse_trainer_state(
    state: dict[str, Any], path: str = "", start: float = 1.7e9, job_id: str = "a0"
) -> ImportedRun:
    history = state.get("log_history")
    if not isinstance(history, list):
        raise ConfigError(f"{path}: not a trainer_state.json (no log_history list)")
    run = ImportedRun(source="hf-trainer", path=path, clock="synthetic")
    run.config = {k: state[k] for k in _CONFIG if state.get(k) is not None}
    a = Attempt(job_id=job_id, start=start)
    runtime = None
    for entry in history:
        if not isinstance(entry, dict) or "step" not in entry:
            continue
        step = int(entry["step"])
        if "train_runtime" in entry:
            runtime = float(entry["train_runtime"])
            continue
        for key, value in entry.items():
            if key in ("step", "epoch") or not isinstance(value, (int, float)):
                continue
            if key.startswith("eval_") and key.endswith(("_runtime", "_per_second")):
                continue
            a.scalar(_NAMES.get(key) or key, step, float(value))
    last = int(state.get("global_step") or max((s[-1] for s, _ in a.scalars.values()), default=0))
    if runtime and last > 0:
        dur = runtime / last
        for s in range(1, last + 1):
            a.steps.append(s)
            a.times.append(start + (s - 1) * dur)
            a.durations.append(dur)
            a.tokens.append(0)
        run.notes.append(f"mean step time {dur:.4g} s (train_runtime / global_step) for every step")
        a.event(start + last * dur, "finish", last, "train_runtime logged")
    a.event(start, "job_start", 0, "imported from Hugging Face Trainer")
    run.attempts.append(a)
    return settle(run)


def read_hf_trainer(path: str | Path, *, start: float = 1.7e9, job_id: str = "a0") -> ImportedRun:
    p = Path(path)
    if p.is_dir():
        p = p / "trainer_state.json"
    try:
        state = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {p} as JSON: {exc}") from exc
    return parse_trainer_state(state, str(p), start, job_id)
