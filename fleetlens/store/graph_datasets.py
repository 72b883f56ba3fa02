"""Datasets and experiments in the run graph: a dataset version is named (``web:v42``) or
content-addressed (its content hash is its version), with its shards' pointers and sha256."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import ConfigError, NotFound
from .graph_models import DatasetVersion, Experiment
from .graph_runs import GraphPart
from .graph_types import DatasetInfo
from .scope import Scope
from .scoped import scoped

__all__ = ["Datasets", "dataset_info", "dataset_ref", "ensure_experiment", "upsert_dataset"]


class Datasets(GraphPart):
    def register_dataset(
        self,
        scope: Scope,
        name: str,
        version: str = "",
        *,
        content_hash: str = "",
        uri: str = "",
        shards: list[dict[str, Any]] | None = None,
    ) -> DatasetInfo:
        """A dataset version; without ``version`` it is the content hash (content-addressed)."""
        ds = dataset_ref(
            {
                "name": name,
                "version": version,
                "content_hash": content_hash,
                "uri": uri,
                "shards": shards or [],
            }
        )
        with self._session() as s:
            upsert_dataset(s, scope.tenant, scope.project, ds)
        return self.dataset(scope, ds["name"], ds["version"])

    def dataset(self, scope: Scope, name: str, version: str) -> DatasetInfo:
        """The version, if the caller may see it: a project-scoped caller sees its project's
        datasets and the tenant's datasets that belong to no project."""
        with self._session() as s:
            q = scoped(select(DatasetVersion), scope, within="project_or_unassigned")
            row = s.scalars(
                q.where(DatasetVersion.name == name, DatasetVersion.version == version)
            ).first()
            if row is None:
                raise NotFound(f"dataset {name}:{version} does not exist")
            return dataset_info(row)


def ensure_experiment(s: Session, tenant: str, project: str, experiment_id: str) -> None:
    found = s.scalars(
        scoped(select(Experiment), tenant).where(Experiment.experiment_id == experiment_id)
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


def upsert_dataset(s: Session, tenant: str, project: str, ds: dict[str, Any]) -> None:
    row = s.scalars(
        scoped(select(DatasetVersion), tenant).where(
            DatasetVersion.name == ds["name"], DatasetVersion.version == ds["version"]
        )
    ).first()
    if row is None:
        row = DatasetVersion(
            tenant=tenant,
            project=project,
            name=ds["name"],
            version=ds["version"],
            content_hash="",
            uri="",
            shards=[],
            created_at=time.time(),
        )
        s.add(row)
    row.content_hash = str(ds.get("content_hash") or row.content_hash)
    row.uri = str(ds.get("uri") or row.uri)
    if ds.get("shards"):
        row.shards = list(ds["shards"])


def dataset_ref(ds: dict[str, Any] | str) -> dict[str, Any]:
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


def dataset_info(r: DatasetVersion) -> DatasetInfo:
    return DatasetInfo(
        name=r.name,
        version=r.version,
        content_hash=r.content_hash or None,
        uri=r.uri or None,
        shards=list(r.shards or []),
        created_at=r.created_at,
    )
