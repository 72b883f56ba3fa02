"""Evaluations in the metadata store: submission, the shard queue, leases, results.

``EvalStore`` is the one object the API holds; each concept has its module: ``submit``
(validation, provenance, the result cache, shard planning), ``lease`` (the exactly-once lease
protocol), ``results`` (reading evaluations, per-example scores, the final aggregation) and
``rows`` (what they share).

Leasing is exactly-once on both engines (see ``lease``). Per-example scores are kept on the
shard row, keyed by example id (so a retry or a partial report can never count an example
twice), and copied into the telemetry store's ``eval_examples`` table for analysis.
"""

from __future__ import annotations

import logging

from ..errors import FleetlensError
from ..store.metadata import MetadataStore
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore
from .doc_types import TemplateValues
from .lease import Heartbeat, Leases, ShardLease, ShardReport
from .requests import EvaluationRequest
from .results import ExampleRow, Results
from .rows import TERMINAL as TERMINAL  # re-exported: the settled evaluation states
from .rows import EvaluationView, ExampleCache
from .submit import Submissions
from .suites import SuiteRegistry, fill_template

log = logging.getLogger("fleetlens.eval")

__all__ = ["EvalStore"]


class EvalStore:
    """Evaluations and their shards; one per server, shared by its request threads."""

    def __init__(self, metadata: MetadataStore, telemetry: TelemetryStore | None = None) -> None:
        self._session = metadata.session
        self._dialect = metadata.engine.dialect.name
        self._telemetry = telemetry
        examples = ExampleCache()
        self._results = Results(self._session, telemetry)
        self.suites = SuiteRegistry(self._session)
        self._submissions = Submissions(self._session, examples, self.suites)
        self._leases = Leases(self._session, self._dialect, examples, self._results)

    # -- submission -----------------------------------------------------------------------------

    def submit(self, scope: Scope, req: EvaluationRequest) -> EvaluationView:
        """Queue an evaluation (or reuse a cached result); returns at once."""
        return self._submissions.submit(scope, req)

    def fire(
        self,
        tenant: str,
        project: str,
        on: str,
        *,
        model_id: str = "",
        version: str = "",
        run_id: str = "",
        checkpoint_id: str = "",
        checkpoint_uri: str = "",
        alias: str = "",
    ) -> dict[str, list[str]]:
        """Start the evaluations the triggers of ``project`` ask for on this event, once each.
        A trigger that cannot submit (its suite was removed, a bad template) is reported, and
        never fails the registration that fired it."""
        out: dict[str, list[str]] = {"evaluations": [], "errors": []}
        values = TemplateValues(
            model_id=model_id,
            model_version=version,
            run_id=run_id,
            checkpoint_id=checkpoint_id,
            checkpoint_uri=checkpoint_uri,
        )
        key = {
            "model_id": model_id,
            "model_version": version,
            "run_id": run_id,
            "checkpoint_id": checkpoint_id,
        }
        for t in self.suites.matching(tenant, project, on, model_id, alias):
            if self.suites.already_fired(tenant, t.trigger_id, key):
                continue
            scope = Scope(
                tenant=tenant, role="editor", project=project, actor=f"trigger:{t.trigger_id}"
            )
            try:
                req = EvaluationRequest(
                    benchmark_suite=t.suite,
                    priority=t.priority,
                    adapter=fill_template(t.adapter, values).as_json(),
                    trigger_id=t.trigger_id,
                    model_id=model_id,
                    model_version=version if model_id else "",
                    run_id="" if model_id else run_id,
                    checkpoint_id="" if model_id else checkpoint_id,
                )
                out["evaluations"].append(self.submit(scope, req).evaluation_id)
            except FleetlensError as exc:
                log.warning("trigger %s could not start an evaluation: %s", t.trigger_id, exc)
                out["errors"].append(f"trigger {t.trigger_id}: {exc}")
        return out

    # -- reading --------------------------------------------------------------------------------

    def get(self, scope: Scope, evaluation_id: str) -> EvaluationView:
        return self._results.get(scope, evaluation_id)

    def evaluations(
        self, scope: Scope, model_id: str = "", limit: int = 100
    ) -> list[EvaluationView]:
        return self._results.evaluations(scope, model_id, limit)

    def scores(self, scope: Scope, evaluation_id: str) -> dict[str, dict[str, dict[str, float]]]:
        """Per-example scores by benchmark (a cache hit's come from the evaluation it reused)."""
        return self._results.scores(scope, evaluation_id)

    def example_rows(
        self, scope: Scope, evaluation_id: str, limit: int = 10000
    ) -> list[ExampleRow]:
        """Per-example scores as the telemetry store holds them."""
        return self._results.example_rows(scope, evaluation_id, limit)

    # -- leasing --------------------------------------------------------------------------------

    def lease(
        self, scope: Scope, worker_id: str, prefer_locality: str = "", lease_s: float = 30.0
    ) -> ShardLease | None:
        """Hand the next shard to ``worker_id``, or None when nothing is runnable."""
        return self._leases.lease(scope, worker_id, prefer_locality, lease_s)

    def heartbeat(
        self,
        scope: Scope,
        shard_id: int,
        token: str,
        lease_s: float = 30.0,
        partial: dict[str, dict[str, float | str]] | None = None,
    ) -> Heartbeat:
        """Extend the lease; record partial per-example results (keyed by example id)."""
        return self._leases.heartbeat(scope, shard_id, token, lease_s, partial)

    def complete(
        self, scope: Scope, shard_id: int, token: str, scores: dict[str, dict[str, float | str]]
    ) -> ShardReport:
        return self._leases.complete(scope, shard_id, token, scores)

    def fail(self, scope: Scope, shard_id: int, token: str, error: str) -> ShardReport:
        """A failed attempt: the shard alone goes back to the queue, or fails at its limit."""
        return self._leases.fail(scope, shard_id, token, error)
