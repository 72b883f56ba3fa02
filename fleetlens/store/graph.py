"""The run graph in the metadata store: registration and lineage, scoped to the caller.

Every method takes the caller's :class:`~.scope.Scope`; an object of another tenant (or, for a
project-scoped caller, of another project) is NotFound, the same as one that does not exist.
Files are reached through fsspec (local paths, ``file://``, ``s3://``, ...): only a pointer and
its sha256 go into the store, and :meth:`GraphStore.model_lineage` can read the bytes again to
check that what the pointer reaches is still what was registered.

``GraphStore`` is the one object the server holds; each concept has its module: ``graph_runs``
(the scoped run look-up, checkpoints, artifacts), ``graph_datasets`` (datasets, experiments),
``graph_versions`` (model versions), ``graph_lineage`` (what a run was made of, and a model
traced back to it) and ``graph_files`` (checksums through fsspec).
"""

from __future__ import annotations

from .graph_datasets import Datasets
from .graph_files import sha256_of
from .graph_lineage import Lineage
from .graph_runs import ARTIFACT_KINDS, RunRecords
from .graph_versions import ModelVersions, model_version

__all__ = ["ARTIFACT_KINDS", "GraphStore", "model_version", "sha256_of"]


class GraphStore(Lineage, ModelVersions, RunRecords, Datasets):
    """Registration and lineage of runs, checkpoints, artifacts, datasets and model versions."""
