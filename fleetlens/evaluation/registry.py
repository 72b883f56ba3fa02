"""The model registry's aliases, quality-gate decisions and promotion.

An alias (``candidate``, ``canary``, ``production`` or any name) points at one registered model
version; every move is recorded (from, to, who, why, the decision behind it) and written to the
audit log. ``canary`` and ``production`` are guarded: a version reaches ``canary`` only with a
passing gate decision about it, and ``production`` only from ``canary`` with a passing decision.
An admin may override the guard with a stated reason; the override is recorded as such.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import ConfigError, NotFound, PromotionRefused
from ..store.access import AccessStore
from ..store.graph import model_version
from ..store.graph_models import ModelVersion
from ..store.metadata import MetadataStore
from ..store.scope import Scope
from ..store.scoped import scoped
from .doc_types import AliasMoveAudit, ReportRecord
from .gates import PERFORMANCE, GateReport, check_json, check_of, evaluate_gate, parse_policies
from .models import AliasMove, Evaluation, GateDecision, ModelAlias
from .store import EvalStore

__all__ = [
    "GUARDED",
    "AliasMoveView",
    "AliasSet",
    "GateDecisionView",
    "PromotionRefused",
    "Registry",
]

GUARDED = ("canary", "production")


@dataclass(frozen=True, slots=True)
class AliasMoveView:
    """One move of an alias."""

    alias: str
    from_version: str | None  # None: a new alias
    to_version: str
    decision_id: str | None  # the gate decision behind it
    override: bool  # an admin moved it without a passing gate
    reason: str
    actor: str
    at: float


@dataclass(frozen=True, slots=True)
class AliasSet:
    """An alias moved, and the model version's run and checkpoint (for the triggers)."""

    model_id: str
    alias: str
    version: str
    from_version: str | None  # None: a new alias
    override: bool
    decision_id: str | None
    project: str
    run_id: str
    checkpoint_id: str


@dataclass(frozen=True, slots=True)
class GateDecisionView:
    """A gate decision: the candidate judged against the baseline, policy by policy. ``actor``
    and ``created_at`` are set on a stored decision read back only."""

    decision_id: str
    model_id: str
    version: str  # the candidate version
    report: GateReport
    baseline_alias: str
    baseline_version: str | None
    baseline_evaluation: str | None
    candidate_evaluation: str
    actor: str | None = None
    created_at: float | None = None


class Registry:
    def __init__(
        self, metadata: MetadataStore, evals: EvalStore, access: AccessStore | None = None
    ) -> None:
        self._session = metadata.session
        self._evals = evals
        self._access = access

    @staticmethod
    def _model_exists(s: Session, scope: Scope, model_id: str) -> None:
        q = scoped(select(ModelVersion.id), scope, within="project")
        q = q.where(ModelVersion.model_id == model_id)
        if s.scalars(q.limit(1)).first() is None:
            raise NotFound(f"model {model_id!r} does not exist")

    # -- aliases --------------------------------------------------------------------------------

    def aliases(self, scope: Scope, model_id: str) -> dict[str, str]:
        with self._session() as s:
            self._model_exists(s, scope, model_id)
            rows = s.scalars(
                scoped(select(ModelAlias), scope).where(ModelAlias.model_id == model_id)
            ).all()
            return {r.alias: r.version for r in rows}

    def resolve(self, scope: Scope, model_id: str, alias: str) -> str | None:
        return self.aliases(scope, model_id).get(alias)

    def history(self, scope: Scope, model_id: str) -> list[AliasMoveView]:
        with self._session() as s:
            self._model_exists(s, scope, model_id)
            rows = s.scalars(
                scoped(select(AliasMove), scope)
                .where(AliasMove.model_id == model_id)
                .order_by(AliasMove.id)
            ).all()
            return [
                AliasMoveView(
                    alias=r.alias,
                    from_version=r.from_version or None,
                    to_version=r.to_version,
                    decision_id=r.decision_id or None,
                    override=r.override,
                    reason=r.reason,
                    actor=r.actor,
                    at=r.at,
                )
                for r in rows
            ]

    def set_alias(
        self,
        scope: Scope,
        model_id: str,
        alias: str,
        version: str,
        *,
        decision_id: str = "",
        override_reason: str = "",
    ) -> AliasSet:
        """Point ``alias`` at ``version``; guarded aliases need a passing gate or an override."""
        if not alias or len(alias) > 128 or "/" in alias:
            raise ConfigError(f"alias {alias!r} must be 1-128 characters without '/'")
        with self._session() as s:
            mv = model_version(s, scope, model_id, version)
            project, run_id, checkpoint_id = mv.project, mv.run_id, mv.checkpoint_id
            current = s.scalars(
                scoped(select(ModelAlias), scope).where(
                    ModelAlias.model_id == model_id,
                    ModelAlias.alias == alias,
                )
            ).first()
            override = False
            if alias in GUARDED:
                refusal = self._guard(s, scope, model_id, alias, version, decision_id)
                if refusal and override_reason:
                    if not scope.can("admin"):
                        raise PromotionRefused(
                            f"{refusal}; only an admin may override, and role "
                            f"{scope.role!r} is not admin"
                        )
                    override = True
                elif refusal:
                    raise PromotionRefused(
                        f"{refusal}; run a gate that passes (POST /v1/gates), or have an admin "
                        "override with a reason"
                    )
            before = current.version if current else ""
            now = time.time()
            if current is None:
                current = ModelAlias(
                    tenant=scope.tenant,
                    project=mv.project,
                    model_id=model_id,
                    alias=alias,
                    version=version,
                    updated_at=now,
                    updated_by=scope.actor,
                )
                s.add(current)
            current.version, current.updated_at, current.updated_by = version, now, scope.actor
            s.add(
                AliasMove(
                    tenant=scope.tenant,
                    model_id=model_id,
                    alias=alias,
                    from_version=before,
                    to_version=version,
                    decision_id=decision_id,
                    override=override,
                    reason=override_reason,
                    actor=scope.actor,
                    at=now,
                )
            )
        if self._access is not None:
            self._access.audit(
                scope.tenant,
                scope.actor,
                "model.alias.override" if override else "model.alias.move",
                f"model:{model_id}:{alias}",
                AliasMoveAudit(
                    from_version=before or None,
                    to=version,
                    decision_id=decision_id or None,
                    reason=override_reason,
                ).as_json(),
                scope.remote,
            )
        return AliasSet(
            model_id=model_id,
            alias=alias,
            version=version,
            from_version=before or None,
            override=override,
            decision_id=decision_id or None,
            project=project,
            run_id=run_id,
            checkpoint_id=checkpoint_id,
        )

    def _guard(
        self, s: Session, scope: Scope, model_id: str, alias: str, version: str, decision_id: str
    ) -> str:
        """Why the move is refused ("" when it may go ahead)."""
        if alias == "production":
            canary = s.scalars(
                scoped(select(ModelAlias), scope).where(
                    ModelAlias.model_id == model_id,
                    ModelAlias.alias == "canary",
                )
            ).first()
            if canary is None or canary.version != version:
                return f"{model_id}:{version} is not the canary; production takes the canary only"
        if not decision_id:
            return f"moving {alias} to {model_id}:{version} needs a passing gate decision"
        d = s.scalars(
            scoped(select(GateDecision), scope).where(GateDecision.decision_id == decision_id)
        ).first()
        if d is None:
            return f"gate decision {decision_id!r} does not exist"
        if (d.model_id, d.candidate_version) != (model_id, version):
            judged = f"{d.model_id}:{d.candidate_version}"
            return f"gate decision {decision_id} judged {judged}, not {version}"
        if not d.passed:
            return f"gate decision {decision_id} failed: {', '.join(d.report.get('failed', []))}"  # type: ignore[arg-type]
        return ""

    # -- gates ----------------------------------------------------------------------------------

    def _latest_eval(self, s: Session, scope: Scope, model_id: str, version: str) -> str:
        row = s.scalars(
            scoped(select(Evaluation), scope)
            .where(
                Evaluation.model_id == model_id,
                Evaluation.model_version == version,
                Evaluation.state == "COMPLETED",
            )
            .order_by(Evaluation.id.desc())
        ).first()
        if row is None:
            raise ConfigError(f"{model_id}:{version} has no completed evaluation to compare")
        return row.evaluation_id

    def run_gate(
        self,
        scope: Scope,
        model_id: str,
        version: str,
        policies: list[dict[str, Any]],
        *,
        candidate_evaluation: str = "",
        baseline_alias: str = "production",
        baseline_evaluation: str = "",
    ) -> GateDecisionView:
        """Judge ``model_id:version`` against the version ``baseline_alias`` points at."""
        parsed = parse_policies(policies)
        with self._session() as s:
            model_version(s, scope, model_id, version)
            cand_eval = candidate_evaluation or self._latest_eval(s, scope, model_id, version)
            base_row = s.scalars(
                scoped(select(ModelAlias), scope).where(
                    ModelAlias.model_id == model_id,
                    ModelAlias.alias == baseline_alias,
                )
            ).first()
            base_version = base_row.version if base_row else ""
            base_eval = baseline_evaluation
            if not base_eval and base_version and base_version != version:
                base_eval = self._latest_eval(s, scope, model_id, base_version)
        cand = self._evals.get(scope, cand_eval)
        if cand.state != "COMPLETED":
            raise ConfigError(f"evaluation {cand_eval} is {cand.state}; gate a COMPLETED one")
        if (cand.model_id, cand.model_version) != (model_id, version):
            raise ConfigError(f"evaluation {cand_eval} judged {cand.model_id}:{cand.model_version}")
        base_scores = self._evals.scores(scope, base_eval) if base_eval else None
        base_perf = (
            self._evals.get(scope, base_eval).metrics.get(PERFORMANCE) if base_eval else None
        )
        decision_id = "gd-" + uuid.uuid4().hex[:16]
        out = GateDecisionView(
            decision_id=decision_id,
            model_id=model_id,
            version=version,
            report=evaluate_gate(
                parsed,
                self._evals.scores(scope, cand_eval),
                base_scores,
                cand.metrics.get(PERFORMANCE) or {},
                base_perf,
            ),
            baseline_alias=baseline_alias,
            baseline_version=base_version or None,
            baseline_evaluation=base_eval or None,
            candidate_evaluation=cand_eval,
        )
        with self._session() as s:
            s.add(
                GateDecision(
                    tenant=scope.tenant,
                    decision_id=decision_id,
                    model_id=model_id,
                    candidate_version=version,
                    baseline_version=base_version,
                    candidate_evaluation=cand_eval,
                    baseline_evaluation=base_eval,
                    passed=out.report.passed,
                    report=_report_json(out).as_json(),
                    actor=scope.actor,
                    created_at=time.time(),
                )
            )
        return out

    def decisions(self, scope: Scope, model_id: str, limit: int = 100) -> list[GateDecisionView]:
        """A model's gate decisions, newest first, each with its report."""
        with self._session() as s:
            self._model_exists(s, scope, model_id)
            rows = s.scalars(
                scoped(select(GateDecision), scope)
                .where(GateDecision.model_id == model_id)
                .order_by(GateDecision.id.desc())
                .limit(limit)
            ).all()
            return [_decision_view(d) for d in rows]

    def decision(self, scope: Scope, decision_id: str) -> GateDecisionView:
        with self._session() as s:
            d = s.scalars(
                scoped(select(GateDecision), scope).where(GateDecision.decision_id == decision_id)
            ).first()
            if d is None:
                raise NotFound(f"gate decision {decision_id!r} does not exist")
            if scope.project:
                model_version(s, scope, d.model_id, d.candidate_version)
            return _decision_view(d)


# -- a decision's report as its JSON column keeps it (and reads it back) ----------------------


def _report_json(v: GateDecisionView) -> ReportRecord:
    return ReportRecord(
        passed=v.report.passed,
        failed=list(v.report.failed),
        warnings=list(v.report.warnings),
        checks=[check_json(c) for c in v.report.checks],
        baseline_alias=v.baseline_alias,
        baseline_version=v.baseline_version,
        baseline_evaluation=v.baseline_evaluation,
        candidate_evaluation=v.candidate_evaluation,
    )


def _decision_view(d: GateDecision) -> GateDecisionView:
    r = ReportRecord.model_validate(d.report)
    return GateDecisionView(
        decision_id=d.decision_id,
        model_id=d.model_id,
        version=d.candidate_version,
        report=GateReport(
            passed=r.passed,
            failed=list(r.failed),
            warnings=list(r.warnings),
            checks=[check_of(c) for c in r.checks],
        ),
        baseline_alias=r.baseline_alias,
        baseline_version=r.baseline_version,
        baseline_evaluation=r.baseline_evaluation,
        candidate_evaluation=r.candidate_evaluation,
        actor=d.actor,
        created_at=d.created_at,
    )
