"""The run graph in the metadata store: registration and lineage, scoped to the caller.

Every method takes the caller's :class:`Scope`; an object of another tenant (or, for a
project-scoped caller, of another project) is NotFound, the same as one that does not exist.
Files are reached through fsspec (local paths, ``file://``, ``s3://``, ...): only a pointer and
its sha256 go into the store, and :meth:`GraphStore.model_lineage` can read the bytes again to
check that what the pointer reaches is still what was registered.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import ConfigError, NotFound
from .graph_models import Artifact, Checkpoint, DatasetVersion, Experiment, ModelVersion, RunExtra
from .metadata import MetadataStore
from .models import Job, Run
from .scope import Scope

__all__ = ["ARTIFACT_KINDS", "GraphStore", "model_version", "sha256_of"]

ARTIFACT_KINDS = ("trace", "log", "eval_output", "checkpoint", "config", "other")
_CHUNK = 8 << 20


def sha256_of(uri: str) -> tuple[str, int]:
    """(hex sha256, size in bytes) of the file ``uri`` reaches through fsspec."""
    import fsspec  # type: ignore[import-untyped]

    h = hashlib.sha256()
    size = 0
    try:
        with fsspec.open(uri, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigError(f"cannot read {uri!r} to checksum it: {exc}") from exc
    return h.hexdigest(), size


def _bare(checksum: str) -> str:
    return checksum.split(":", 1)[1] if checksum.startswith("sha256:") else checksum


def model_version(s: Session, scope: Scope, model_id: str, version: str) -> ModelVersion:
    """The caller's model version, or NotFound (also for another tenant's or project's)."""
    q = select(ModelVersion).where(
        ModelVersion.tenant == scope.tenant,
        ModelVersion.model_id == model_id,
        ModelVersion.version == version,
    )
    if scope.project:
        q = q.where(ModelVersion.project == scope.project)
    row = s.scalars(q).first()
    if row is None:
        raise NotFound(f"model version {model_id}:{version} does not exist")
    return row


class GraphStore:
    def __init__(self, metadata: MetadataStore) -> None:
        self._session = metadata._session  # one database, one session factory

    # -- scoping ------------------------------------------------------------------------------

    @staticmethod
    def _run(s: Session, scope: Scope, run_id: str) -> Run:
        q = select(Run).where(Run.tenant == scope.tenant, Run.run_id == run_id)
        if scope.project:
            q = q.where(Run.project == scope.project)
        run = s.scalars(q).first()
        if run is None:
            raise NotFound(f"run {run_id!r} does not exist")
        return run

    @staticmethod
    def _extra(s: Session, tenant: str, run_id: str) -> RunExtra:
        extra = s.scalars(
            select(RunExtra).where(RunExtra.tenant == tenant, RunExtra.run_id == run_id)
        ).first()
        if extra is None:
            extra = RunExtra(tenant=tenant, run_id=run_id, code={}, environment={}, updated_at=0.0)
            s.add(extra)
        return extra

    # -- registration -------------------------------------------------------------------------

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
    ) -> dict[str, Any]:
        """Record what the run was made of (what the SDK did not see, or an imported run's)."""
        ds = _dataset_ref(dataset) if dataset is not None else None
        with self._session() as s:
            run = self._run(s, scope, run_id)
            if config is not None:
                run.config = dict(config)
            if experiment_id:
                run.experiment_id = experiment_id
                self._ensure_experiment(s, scope.tenant, run.project, experiment_id)
            extra = self._extra(s, scope.tenant, run_id)
            if code is not None:
                extra.code = {"commit": code} if isinstance(code, str) else dict(code)
            if ds is not None:
                extra.dataset_name, extra.dataset_version = ds["name"], ds["version"]
                if ds.get("content_hash") or ds.get("shards"):
                    self._upsert_dataset(s, scope.tenant, run.project, ds)
            if launch_command is not None:
                extra.launch_command = launch_command
            if environment is not None:
                extra.environment = {**(extra.environment or {}), **environment}
            extra.updated_at = time.time()
        return self.run_lineage(scope, run_id)

    @staticmethod
    def _ensure_experiment(s: Session, tenant: str, project: str, experiment_id: str) -> None:
        found = s.scalars(
            select(Experiment).where(
                Experiment.tenant == tenant, Experiment.experiment_id == experiment_id
            )
        ).first()
        if found is None:
            s.add(
                Experiment(
                    tenant=tenant,
                    project=project,
                    experiment_id=experiment_id,
                    description="",
                    created_at=time.time(),
                )
            )

    @staticmethod
    def _upsert_dataset(s: Session, tenant: str, project: str, ds: dict[str, Any]) -> None:
        row = s.scalars(
            select(DatasetVersion).where(
                DatasetVersion.tenant == tenant,
                DatasetVersion.name == ds["name"],
                DatasetVersion.version == ds["version"],
            )
        ).first()
        if row is None:
            row = DatasetVersion(
                tenant=tenant, project=project, name=ds["name"], version=ds["version"],
                content_hash="", uri="", shards=[], created_at=time.time(),
            )  # fmt: skip
            s.add(row)
        row.content_hash = str(ds.get("content_hash") or row.content_hash)
        row.uri = str(ds.get("uri") or row.uri)
        if ds.get("shards"):
            row.shards = list(ds["shards"])

    def register_dataset(
        self,
        scope: Scope,
        name: str,
        version: str = "",
        *,
        content_hash: str = "",
        uri: str = "",
        shards: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """A dataset version; without ``version`` it is the content hash (content-addressed)."""
        ds = _dataset_ref(
            {"name": name, "version": version, "content_hash": content_hash, "uri": uri,
             "shards": shards or []}
        )  # fmt: skip
        with self._session() as s:
            self._upsert_dataset(s, scope.tenant, scope.project, ds)
        return self.dataset(scope, ds["name"], ds["version"])

    def dataset(self, scope: Scope, name: str, version: str) -> dict[str, Any]:
        with self._session() as s:
            q = select(DatasetVersion).where(
                DatasetVersion.tenant == scope.tenant,
                DatasetVersion.name == name,
                DatasetVersion.version == version,
            )
            if scope.project:
                q = q.where(DatasetVersion.project.in_(("", scope.project)))
            row = s.scalars(q).first()
            if row is None:
                raise NotFound(f"dataset {name}:{version} does not exist")
            return _dataset_json(row)

    def record_checkpoint(
        self,
        scope: Scope,
        run_id: str,
        step: int,
        *,
        uri: str = "",
        job_id: str = "",
        size_bytes: int | None = None,
        checksum: str = "",
        duration_s: float | None = None,
        sync: bool = True,
        ok: bool = True,
        at: float | None = None,
        checkpoint_id: str = "",
        compute_checksum: bool = False,
    ) -> dict[str, Any]:
        """Record (or update) a checkpoint of a run; its id defaults to ``<run>@<step>``."""
        if compute_checksum and uri and not checksum:
            digest, size = sha256_of(uri)
            checksum, size_bytes = f"sha256:{digest}", size_bytes or size
        cid = checkpoint_id or f"{run_id}@{step}"
        with self._session() as s:
            self._run(s, scope, run_id)
            row = s.scalars(
                select(Checkpoint).where(
                    Checkpoint.tenant == scope.tenant,
                    Checkpoint.run_id == run_id,
                    Checkpoint.checkpoint_id == cid,
                )
            ).first()
            if row is None:
                row = Checkpoint(tenant=scope.tenant, run_id=run_id, checkpoint_id=cid, uri="",
                                 checksum="", job_id="")  # fmt: skip
                s.add(row)
            row.step, row.sync, row.ok = int(step), bool(sync), bool(ok)
            row.uri = uri or row.uri
            row.job_id = job_id or row.job_id
            row.checksum = checksum or row.checksum
            row.size_bytes = size_bytes if size_bytes is not None else row.size_bytes
            row.duration_s = duration_s if duration_s is not None else row.duration_s
            row.time = at if at is not None else (row.time or time.time())
            return _checkpoint_json(row)

    def checkpoints(self, scope: Scope, run_id: str) -> list[dict[str, Any]]:
        with self._session() as s:
            self._run(s, scope, run_id)
            rows = s.scalars(
                select(Checkpoint)
                .where(Checkpoint.tenant == scope.tenant, Checkpoint.run_id == run_id)
                .order_by(Checkpoint.step, Checkpoint.time)
            ).all()
            return [_checkpoint_json(r) for r in rows]

    def _checkpoint(
        self,
        s: Session,
        scope: Scope,
        run_id: str,
        checkpoint_id: str = "",
        step: int | None = None,
    ) -> Checkpoint:
        self._run(s, scope, run_id)
        q = select(Checkpoint).where(Checkpoint.tenant == scope.tenant, Checkpoint.run_id == run_id)
        if checkpoint_id:
            q = q.where(Checkpoint.checkpoint_id == checkpoint_id)
        elif step is not None:
            q = q.where(Checkpoint.step == step).order_by(Checkpoint.time.desc())
        else:
            raise ConfigError("name the checkpoint: its id, or the run's step")
        row = s.scalars(q).first()
        if row is None:
            what = checkpoint_id or f"at step {step}"
            raise NotFound(f"checkpoint {what} of run {run_id!r} does not exist")
        return row

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
    ) -> dict[str, Any]:
        """Register ``model_id:version`` from a checkpoint of a run (by id or by step)."""
        with self._session() as s:
            ck = self._checkpoint(s, scope, run_id, checkpoint_id, step)
            if not ck.ok:
                raise ConfigError(
                    f"checkpoint {ck.checkpoint_id} did not save successfully (ok=false); "
                    "register a model version from a good checkpoint"
                )
            run = self._run(s, scope, run_id)
            row = s.scalars(
                select(ModelVersion).where(
                    ModelVersion.tenant == scope.tenant,
                    ModelVersion.model_id == model_id,
                    ModelVersion.version == version,
                )
            ).first()
            if row is not None and (row.run_id, row.checkpoint_id) != (run_id, ck.checkpoint_id):
                raise ConfigError(
                    f"model {model_id}:{version} is already registered from checkpoint "
                    f"{row.checkpoint_id}; a version is immutable, register a new version"
                )
            if row is None:
                row = ModelVersion(
                    tenant=scope.tenant, project=run.project, model_id=model_id, version=version,
                    run_id=run_id, checkpoint_id=ck.checkpoint_id, metrics={},
                    created_at=time.time(), created_by=scope.actor,
                )  # fmt: skip
                s.add(row)
            if evaluation_id is not None:
                row.evaluation_id = evaluation_id
            if metrics:
                row.metrics = {**(row.metrics or {}), **metrics}
            return _model_json(row)

    def model_versions(self, scope: Scope, model_id: str | None = None) -> list[dict[str, Any]]:
        with self._session() as s:
            q = select(ModelVersion).where(ModelVersion.tenant == scope.tenant)
            if scope.project:
                q = q.where(ModelVersion.project == scope.project)
            if model_id:
                q = q.where(ModelVersion.model_id == model_id)
            rows = s.scalars(q.order_by(ModelVersion.model_id, ModelVersion.created_at)).all()
            return [_model_json(r) for r in rows]

    def register_artifact(
        self,
        scope: Scope,
        run_id: str,
        name: str,
        uri: str,
        *,
        kind: str = "other",
        sha256: str = "",
        compute_checksum: bool = True,
    ) -> dict[str, Any]:
        """A file of a run, by pointer; its sha256 is read through fsspec unless given."""
        if kind not in ARTIFACT_KINDS:
            raise ConfigError(f"artifact kind {kind!r} is unknown; use one of {ARTIFACT_KINDS}")
        size: int | None = None
        if not sha256 and compute_checksum:
            sha256, size = sha256_of(uri)
        with self._session() as s:
            self._run(s, scope, run_id)
            row = s.scalars(
                select(Artifact).where(
                    Artifact.tenant == scope.tenant,
                    Artifact.run_id == run_id,
                    Artifact.name == name,
                )
            ).first()
            if row is None:
                row = Artifact(tenant=scope.tenant, run_id=run_id, name=name, uri=uri,
                               created_at=time.time())  # fmt: skip
                s.add(row)
            row.kind, row.uri, row.sha256, row.size_bytes = kind, uri, _bare(sha256), size
            return _artifact_json(row)

    def artifacts(self, scope: Scope, run_id: str) -> list[dict[str, Any]]:
        with self._session() as s:
            self._run(s, scope, run_id)
            rows = s.scalars(
                select(Artifact)
                .where(Artifact.tenant == scope.tenant, Artifact.run_id == run_id)
                .order_by(Artifact.name)
            ).all()
            return [_artifact_json(r) for r in rows]

    # -- lineage ------------------------------------------------------------------------------

    def run_lineage(self, scope: Scope, run_id: str) -> dict[str, Any]:
        """Run -> experiment, config, code, dataset, environment, jobs, checkpoints, models."""
        with self._session() as s:
            run = self._run(s, scope, run_id)
            extra = s.scalars(
                select(RunExtra).where(RunExtra.tenant == scope.tenant, RunExtra.run_id == run_id)
            ).first()
            dataset: dict[str, Any] | None = None
            if extra is not None and extra.dataset_name:
                row = s.scalars(
                    select(DatasetVersion).where(
                        DatasetVersion.tenant == scope.tenant,
                        DatasetVersion.name == extra.dataset_name,
                        DatasetVersion.version == extra.dataset_version,
                    )
                ).first()
                dataset = (
                    _dataset_json(row)
                    if row is not None
                    else {"name": extra.dataset_name, "version": extra.dataset_version}
                )
            jobs = s.scalars(
                select(Job)
                .where(Job.tenant == scope.tenant, Job.run_id == run_id)
                .order_by(Job.first_seen)
            ).all()
            cks = s.scalars(
                select(Checkpoint)
                .where(Checkpoint.tenant == scope.tenant, Checkpoint.run_id == run_id)
                .order_by(Checkpoint.step)
            ).all()
            models = s.scalars(
                select(ModelVersion).where(
                    ModelVersion.tenant == scope.tenant, ModelVersion.run_id == run_id
                )
            ).all()
            return {
                "runId": run.run_id,
                "project": run.project,
                "experimentId": run.experiment_id or None,
                "config": dict(run.config or {}),
                "code": dict(extra.code or {}) if extra else {},
                "dataset": dataset,
                "launchCommand": (extra.launch_command or None) if extra else None,
                "environment": dict(extra.environment or {}) if extra else {},
                "jobs": [
                    {
                        "jobId": j.job_id,
                        "status": j.status,
                        "firstSeen": j.first_seen,
                        "lastSeen": j.last_seen,
                        "lastStep": j.last_step,
                    }
                    for j in jobs
                ],
                "checkpoints": [_checkpoint_json(c) for c in cks],
                "modelVersions": [_model_json(m) for m in models],
            }

    def model_lineage(
        self, scope: Scope, model_id: str, version: str, *, verify: bool = False
    ) -> dict[str, Any]:
        """Model version -> evaluation (optional) -> checkpoint -> step -> run -> config,
        dataset and code. With ``verify``, re-read the checkpoint and the dataset's shards
        through fsspec and compare their sha256 with what was registered."""
        with self._session() as s:
            mv = model_version(s, scope, model_id, version)
            run_id, cid, evaluation_id = mv.run_id, mv.checkpoint_id, mv.evaluation_id
            model = _model_json(mv)
            ck = _checkpoint_json(self._checkpoint(s, scope, run_id, cid))
        run = self.run_lineage(scope, run_id)
        out: dict[str, Any] = {
            "model": model,
            "evaluation": {"evaluationId": evaluation_id} if evaluation_id else None,
            "checkpoint": ck,
            "step": ck["step"],
            "run": {k: run[k] for k in ("runId", "project", "experimentId", "config", "code",
                                        "dataset", "launchCommand", "environment")},
        }  # fmt: skip
        if verify:
            out["verification"] = _verify(ck, run.get("dataset"))
        return out


def _verify(ck: dict[str, Any], dataset: dict[str, Any] | None) -> dict[str, Any]:
    checks: list[dict[str, Any]] = []

    def check(what: str, uri: str, expected: str) -> None:
        if not uri or not expected:
            checks.append({"what": what, "uri": uri, "ok": None, "reason": "no checksum stored"})
            return
        try:
            digest, _ = sha256_of(uri)
        except ConfigError as exc:
            checks.append({"what": what, "uri": uri, "ok": False, "reason": str(exc)})
            return
        ok = digest == _bare(expected)
        checks.append({"what": what, "uri": uri, "ok": ok, "expected": _bare(expected),
                       "actual": digest})  # fmt: skip

    check("checkpoint", ck.get("uri", ""), ck.get("checksum", ""))
    for shard in (dataset or {}).get("shards", []) or []:
        check("dataset shard", str(shard.get("uri", "")), str(shard.get("sha256", "")))
    known = [c["ok"] for c in checks if c["ok"] is not None]
    return {"ok": bool(known) and all(known), "checks": checks}


def _dataset_ref(ds: dict[str, Any] | str) -> dict[str, Any]:
    """``"name:version"`` or a mapping with name and version (or content_hash)."""
    if isinstance(ds, str):
        name, _, version = ds.partition(":")
        out: dict[str, Any] = {"name": name, "version": version}
    else:
        out = dict(ds)
    name = str(out.get("name") or "")
    version = str(out.get("version") or out.get("content_hash") or "")
    if not name or not version:
        raise ConfigError(
            f"dataset {ds!r} needs a name and a version (or a content hash), e.g. 'web:v42'"
        )
    out["name"], out["version"] = name, version
    shards = out.get("shards") or []
    if not isinstance(shards, list) or not all(isinstance(x, dict) for x in shards):
        raise ConfigError("dataset shards must be a list of objects {uri, sha256, ...}")
    return out


def _dataset_json(r: DatasetVersion) -> dict[str, Any]:
    return {
        "name": r.name,
        "version": r.version,
        "contentHash": r.content_hash or None,
        "uri": r.uri or None,
        "shards": list(r.shards or []),
        "createdAt": r.created_at,
    }


def _checkpoint_json(r: Checkpoint) -> dict[str, Any]:
    return {
        "checkpointId": r.checkpoint_id,
        "runId": r.run_id,
        "jobId": r.job_id or None,
        "step": r.step,
        "uri": r.uri,
        "sizeBytes": r.size_bytes,
        "checksum": r.checksum or None,
        "durationSeconds": r.duration_s,
        "sync": r.sync,
        "ok": r.ok,
        "time": r.time,
    }


def _model_json(r: ModelVersion) -> dict[str, Any]:
    return {
        "modelId": r.model_id,
        "version": r.version,
        "runId": r.run_id,
        "checkpointId": r.checkpoint_id,
        "evaluationId": r.evaluation_id,
        "metrics": dict(r.metrics or {}),
        "createdAt": r.created_at,
        "createdBy": r.created_by,
    }


def _artifact_json(r: Artifact) -> dict[str, Any]:
    return {
        "name": r.name,
        "kind": r.kind,
        "uri": r.uri,
        "sizeBytes": r.size_bytes,
        "sha256": r.sha256 or None,
        "createdAt": r.created_at,
    }
