"""Model versions in the run graph: ``model_id:version`` registered from a good checkpoint of a
run, immutable once registered (a new checkpoint is a new version)."""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import ConfigError, NotFound
from .graph_models import ModelVersion
from .graph_runs import GraphPart, checkpoint_row, run_row
from .graph_types import ModelVersionInfo
from .scope import Scope
from .scoped import scoped

__all__ = ["ModelVersions", "model_info", "model_version"]


def model_version(s: Session, scope: Scope, model_id: str, version: str) -> ModelVersion:
    """The caller's model version, or NotFound (also for another tenant's or project's)."""
    q = scoped(select(ModelVersion), scope, within="project").where(
        ModelVersion.model_id == model_id, ModelVersion.version == version
    )
    row = s.scalars(q).first()
    if row is None:
        raise NotFound(f"model version {model_id}:{version} does not exist")
    return row


class ModelVersions(GraphPart):
    def register_model_version(
        self,
        scope: Scope,
        model_id: str,
        version: str,
        run_id: str,
        *,
        checkpoint_id: str = "",
        step: int | None = None,
        evaluation_id: str | None = None,
        metrics: dict[str, float] | None = None,
    ) -> ModelVersionInfo:
        """Register ``model_id:version`` from a checkpoint of a run (by id or by step)."""
        with self._session() as s:
            ck = checkpoint_row(s, scope, run_id, checkpoint_id, step)
            if not ck.ok:
                raise ConfigError(
                    f"checkpoint {ck.checkpoint_id} did not save successfully (ok=false); "
                    "register a model version from a good checkpoint"
                )
            run = run_row(s, scope, run_id)
            # Versions are unique in the tenant, so another project's is found here too.
            row = s.scalars(
                scoped(select(ModelVersion), scope).where(
                    ModelVersion.model_id == model_id, ModelVersion.version == version
                )
            ).first()
            if row is not None and (row.run_id, row.checkpoint_id) != (run_id, ck.checkpoint_id):
                raise ConfigError(
                    f"model {model_id}:{version} is already registered from checkpoint "
                    f"{row.checkpoint_id}; a version is immutable, register a new version"
                )
            if row is None:
                row = ModelVersion(
                    tenant=scope.tenant,
                    project=run.project,
                    model_id=model_id,
                    version=version,
                    run_id=run_id,
                    checkpoint_id=ck.checkpoint_id,
                    metrics={},
                    created_at=time.time(),
                    created_by=scope.actor,
                )
                s.add(row)
            if evaluation_id is not None:
                row.evaluation_id = evaluation_id
            if metrics:
                row.metrics = {**(row.metrics or {}), **metrics}
            return model_info(row)

    def model_versions(self, scope: Scope, model_id: str | None = None) -> list[ModelVersionInfo]:
        with self._session() as s:
            q = scoped(select(ModelVersion), scope, within="project")
            if model_id:
                q = q.where(ModelVersion.model_id == model_id)
            rows = s.scalars(q.order_by(ModelVersion.model_id, ModelVersion.created_at)).all()
            return [model_info(r) for r in rows]


def model_info(r: ModelVersion) -> ModelVersionInfo:
    return ModelVersionInfo(
        model_id=r.model_id,
        version=r.version,
        run_id=r.run_id,
        checkpoint_id=r.checkpoint_id,
        evaluation_id=r.evaluation_id,
        metrics=dict(r.metrics or {}),
        created_at=r.created_at,
        created_by=r.created_by,
    )
