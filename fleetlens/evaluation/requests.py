"""What the evaluation code is asked to do, as typed values: the API validates a request's JSON
(camelCase, ``fleetlens.api.evaluation_requests``) and hands these down."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["EvaluationRequest", "TriggerRequest"]


@dataclass(frozen=True, slots=True)
class EvaluationRequest:
    """An evaluation to queue. The model is named by ``model_id`` + ``model_version``, by
    ``run_id`` + ``checkpoint_id``, by ``model_version`` or ``checkpoint_id`` alone (the
    tenant's one of that name), or by nothing but ``model_hash`` (or the adapter spec itself).
    The suite is ``suite`` (inline: the user's JSON spec) or the registered ``benchmark_suite``.
    ``adapter`` and ``decoding`` are JSON specs too (default: the suite's)."""

    adapter: dict[str, Any] | None = None
    suite: dict[str, Any] | None = None
    benchmark_suite: str = ""
    model_id: str = ""
    model_version: str = ""
    run_id: str = ""
    checkpoint_id: str = ""
    model_hash: str = ""
    decoding: dict[str, Any] = field(default_factory=dict)
    priority: str = "P2"
    deadline: float | None = None
    shard_size: int = 50
    max_attempts: int = 3
    code_commit: str = ""
    no_cache: bool = False
    evaluator_version: str = ""  # empty: this evaluator's (EVALUATOR_VERSION)
    trigger_id: str = ""  # set when a trigger submitted it


@dataclass(frozen=True, slots=True)
class TriggerRequest:
    """A policy to add: on ``on`` (model, checkpoint, alias) evaluate on ``suite``."""

    on: str
    suite: str
    project: str = ""
    model_id: str = ""
    alias: str = ""
    adapter: dict[str, Any] | None = None
    priority: str = "P1"
