"""Lineage in the run graph: what a run was made of (config, code, dataset, launch command,
environment, experiment), and a model version traced back through its checkpoint to the run."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .graph_datasets import dataset_info, dataset_ref, ensure_experiment, upsert_dataset
from .graph_files import verify as verify_files
from .graph_models import Checkpoint, DatasetVersion, ModelVersion, RunExtra
from .graph_runs import GraphPart, checkpoint_info, checkpoint_row, run_row
from .graph_types import DatasetInfo, DatasetRef, JobLineage, ModelLineage, RunLineage
from .graph_versions import model_info, model_version
from .metadata import retry_conflicts
from .models import Job
from .scope import Scope
from .scoped import scoped

__all__ = ["Lineage"]


def _extra(s: Session, tenant: str, run_id: str) -> RunExtra:
    extra = s.scalars(scoped(select(RunExtra), tenant).where(RunExtra.run_id == run_id)).first()
    if extra is None:
        extra = RunExtra(tenant=tenant, run_id=run_id, code={}, environment={}, updated_at=0.0)
        s.add(extra)
    return extra


class Lineage(GraphPart):
    def describe_run(
        self,
        scope: Scope,
        run_id: str,
        *,
        config: dict[str, Any] | None = None,
        code: dict[str, Any] | str | None = None,
        dataset: dict[str, Any] | str | None = None,
        launch_command: str | None = None,
        environment: dict[str, Any] | None = None,
        experiment_id: str | None = None,
    ) -> RunLineage:
        """Record what the run was made of (what the SDK did not see, or an imported run's)."""
        ds = dataset_ref(dataset) if dataset is not None else None

        def write() -> None:  # the ranks of a job starting together all describe it
            with self._session() as s:
                run = run_row(s, scope, run_id)
                if config is not None:
                    run.config = dict(config)
                if experiment_id:
                    run.experiment_id = experiment_id
                    ensure_experiment(s, scope.tenant, run.project, experiment_id)
                extra = _extra(s, scope.tenant, run_id)
                if code is not None:
                    extra.code = {"commit": code} if isinstance(code, str) else dict(code)
                if ds is not None:
                    extra.dataset_name, extra.dataset_version = ds["name"], ds["version"]
                    if ds.get("content_hash") or ds.get("shards"):
                        upsert_dataset(s, scope.tenant, run.project, ds)
                if launch_command is not None:
                    extra.launch_command = launch_command
                if environment is not None:
                    extra.environment = {**(extra.environment or {}), **environment}
                extra.updated_at = time.time()

        retry_conflicts(write)
        return self.run_lineage(scope, run_id)

    def run_lineage(self, scope: Scope, run_id: str) -> RunLineage:
        """Run -> experiment, config, code, dataset, environment, jobs, checkpoints, models."""
        with self._session() as s:
            run = run_row(s, scope, run_id)
            extra = s.scalars(
                scoped(select(RunExtra), scope).where(RunExtra.run_id == run_id)
            ).first()
            dataset: DatasetInfo | DatasetRef | None = None
            if extra is not None and extra.dataset_name:
                row = s.scalars(
                    scoped(select(DatasetVersion), scope).where(
                        DatasetVersion.name == extra.dataset_name,
                        DatasetVersion.version == extra.dataset_version,
                    )
                ).first()
                dataset = (
                    dataset_info(row)
                    if row is not None
                    else DatasetRef(extra.dataset_name, extra.dataset_version)
                )
            jobs = s.scalars(
                scoped(select(Job), scope).where(Job.run_id == run_id).order_by(Job.first_seen)
            ).all()
            cks = s.scalars(
                scoped(select(Checkpoint), scope)
                .where(Checkpoint.run_id == run_id)
                .order_by(Checkpoint.step)
            ).all()
            models = s.scalars(
                scoped(select(ModelVersion), scope).where(ModelVersion.run_id == run_id)
            ).all()
            return RunLineage(
                run_id=run.run_id,
                project=run.project,
                experiment_id=run.experiment_id or None,
                config=dict(run.config or {}),
                code=dict(extra.code or {}) if extra else {},
                dataset=dataset,
                launch_command=(extra.launch_command or None) if extra else None,
                environment=dict(extra.environment or {}) if extra else {},
                jobs=[
                    JobLineage(j.job_id, j.status, j.first_seen, j.last_seen, j.last_step)
                    for j in jobs
                ],
                checkpoints=[checkpoint_info(c) for c in cks],
                model_versions=[model_info(m) for m in models],
            )

    def model_lineage(
        self, scope: Scope, model_id: str, version: str, *, verify: bool = False
    ) -> ModelLineage:
        """Model version -> evaluation (optional) -> checkpoint -> step -> run -> config,
        dataset and code. With ``verify``, re-read the checkpoint and the dataset's shards
        through fsspec and compare their sha256 with what was registered."""
        with self._session() as s:
            mv = model_version(s, scope, model_id, version)
            model = model_info(mv)
            ck = checkpoint_info(checkpoint_row(s, scope, mv.run_id, mv.checkpoint_id))
        run = self.run_lineage(scope, model.run_id)
        verification = None
        if verify:
            ds = run.dataset
            shards = {"shards": ds.shards} if isinstance(ds, DatasetInfo) else None
            verification = verify_files({"uri": ck.uri, "checksum": ck.checksum or ""}, shards)
        return ModelLineage(model, model.evaluation_id or None, ck, run, verification)
