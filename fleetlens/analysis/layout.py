"""A job's parallel layout: how many ways it splits tensors, pipeline stages, data and sequence,
and where each rank sits in that grid.

The sizes come from the run's config under the names the frameworks use: Megatron-LM's
(``tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
``virtual_pipeline_model_parallel_size``, ``context_parallel_size``,
``expert_model_parallel_size``, ``data_parallel_size``), torchtitan's (``[parallelism]``:
``tensor_parallel_degree``, ``pipeline_parallel_degree``, ``context_parallel_degree``,
``data_parallel_replicate_degree`` x ``data_parallel_shard_degree``, ``expert_parallel_degree``,
flat, dotted or nested under ``parallelism``), DeepSpeed's (``pipeline_parallel_size``,
``sequence_parallel_size`` for Ulysses, ``tensor_parallel_size``), the short ``tp``/``pp``/
``dp``/``cp``/``ep``, and a ``torch.distributed.device_mesh.DeviceMesh``'s dimensions
(:func:`mesh_config`, which also records the mesh's order), and the process groups a profiler
trace lists (:func:`groups_config`). The data-parallel size, when the
config does not give it, is what the world leaves: ``world / (tp x cp x pp)``.

Rank order is the frameworks' common one: the tensor-parallel coordinate varies fastest, then
context (sequence), then data, then pipeline (Megatron's ``tp-cp-ep-dp-pp``, torchtitan's mesh
``pp, dp, cp, tp``, DeepSpeed's ``pipe, data, model``), unless the config's ``parallel_order``
(outermost first, as a mesh names its dimensions) says otherwise. Expert parallelism reuses the
data-parallel ranks of the dense layers, so it names no coordinate of its own here.

What the analyses take from it: the *peers* of a rank are the ranks of its pipeline stage (same
role, same share of the model), so a last stage that computes the loss and the output embedding
is compared with itself, not with the job (:func:`peer_normalize`), and a stage slower for every
replica is a partitioning finding (:mod:`fleetlens.analysis.stages`), never a slow worker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from .nanstats import nanmedian

__all__ = [
    "AXES",
    "ParallelLayout",
    "config_size",
    "groups_config",
    "layout_of",
    "mesh_config",
    "peer_normalize",
]

AXES = ("pp", "dp", "cp", "tp")
"""The coordinates of a rank, outermost first (the default order)."""

_KEYS: dict[str, tuple[str, ...]] = {
    "tp": ("tp", "tensor_model_parallel_size", "tensor_parallel_size", "tp_size",
           "tensor_parallel_degree"),
    "pp": ("pp", "pipeline_model_parallel_size", "pipeline_parallel_size", "pp_size",
           "pipeline_parallel_degree", "num_stages"),
    "cp": ("cp", "context_parallel_size", "context_parallel_degree", "cp_size",
           "sequence_parallel_size", "ulysses_sequence_parallel_size", "sp_size"),
    "ep": ("ep", "expert_model_parallel_size", "expert_parallel_size", "expert_parallel_degree",
           "ep_size"),
    "vpp": ("vpp", "virtual_pipeline_model_parallel_size", "virtual_pipeline_parallel_size"),
    "dp": ("dp", "data_parallel_size", "dp_size", "data_parallel_degree"),
}  # fmt: skip
_DP_PRODUCT = ("data_parallel_replicate_degree", "data_parallel_shard_degree")  # torchtitan
_MESH_NAMES = {
    "pp": ("pp", "pipe", "pipeline"),
    "tp": ("tp", "tensor", "model", "mp"),
    "cp": ("cp", "context", "sp", "seq", "sequence", "ulysses"),
    "ep": ("ep", "expert"),
    "dp": ("dp", "data", "fsdp", "ddp", "hsdp", "replicate", "shard", "dp_replicate", "dp_shard",
           "dp_shard_cp", "dp_cp"),
}  # fmt: skip


@dataclass(frozen=True)
class ParallelLayout:
    """The sizes of a job's parallel dimensions, and the order its ranks fill them."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    order: tuple[str, ...] = AXES  # outermost first
    source: str = "config"  # config | mesh

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def coords(self, rank: int) -> dict[str, int]:
        """The rank's coordinate on every axis of :data:`AXES` (0-based)."""
        out: dict[str, int] = {}
        rest = rank
        for axis in reversed(self.order):  # the innermost varies fastest
            size = getattr(self, axis)
            out[axis] = rest % size
            rest //= size
        return {a: out[a] for a in AXES}

    def stages(self, world: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The pipeline stage of ranks ``0..world-1`` (-1 past the layout's world)."""
        return self.coordinate(world, "pp")

    def replicas(self, world: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The data-parallel replica of ranks ``0..world-1`` (-1 past the layout's world)."""
        return self.coordinate(world, "dp")

    def coordinate(self, world: int, axis: str) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Ranks ``0..world-1``'s coordinate on ``axis`` (one of :data:`AXES`; -1 past the
        layout's world)."""
        ranks = np.arange(world)
        inner = 1
        for a in reversed(self.order):
            if a == axis:
                break
            inner *= int(getattr(self, a))
        size = int(getattr(self, axis))
        out = np.where(ranks < self.world, (ranks // inner) % size, -1)
        return out.astype(np.int64)

    def to_json(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "cp": self.cp,
            "ep": self.ep,
            "vpp": self.vpp,
            "world": self.world,
            "order": list(self.order),
            "source": self.source,
        }


def _size(v: Any) -> int | None:
    """A parallel size from a config value: a positive whole number (bools are flags, not
    sizes: Megatron's ``sequence_parallel`` is one); -1 (torchtitan's "the rest") is None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float) and v == int(v) and v >= 1:
        return int(v)
    if isinstance(v, str) and v.strip().isdigit() and int(v) >= 1:
        return int(v)
    return None


def _flat(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config with torchtitan's ``parallelism`` section (nested or dotted) lifted up."""
    out = dict(config)
    nested = config.get("parallelism")
    if isinstance(nested, Mapping):
        for k, v in nested.items():
            out.setdefault(str(k), v)
    for k, v in config.items():
        if isinstance(k, str) and k.startswith("parallelism."):
            out.setdefault(k.split(".", 1)[1], v)
    return out


def _order(v: Any) -> tuple[str, ...] | None:
    if isinstance(v, str):
        v = [p for p in v.replace("-", ",").split(",") if p.strip()]
    if not isinstance(v, Sequence) or isinstance(v, str):
        return None
    axes = [str(a).strip() for a in v if str(a).strip() in AXES]
    return tuple(axes + [a for a in AXES if a not in axes]) if axes else None


def config_size(config: Mapping[str, Any], axis: str) -> int | None:
    """The size the config gives one axis (``tp``, ``pp``, ``dp``, ``cp``, ``ep``, ``vpp``)
    under any of the frameworks' names, or None when it names none."""
    c = _flat(config)
    for key in _KEYS[axis]:
        if (n := _size(c.get(key))) is not None:
            return n
    if axis == "dp":
        parts = [_size(c.get(k)) for k in _DP_PRODUCT]
        if all(p is not None for p in parts):
            return int(np.prod([p for p in parts if p is not None]))
    return None


def layout_of(config: Mapping[str, Any], world: int) -> ParallelLayout | None:
    """The run's layout from its config, or None when the config names no model-parallel size
    (a plain data-parallel job: every rank is every other's peer) or names sizes that do not
    divide the world (the layout cannot be placed: the analyses fall back to the whole job)."""
    c = _flat(config)
    sizes = {a: n for a in _KEYS if (n := config_size(c, a)) is not None}
    tp, pp, cp = sizes.get("tp", 1), sizes.get("pp", 1), sizes.get("cp", 1)
    if tp * pp * cp == 1:
        return None
    model = tp * pp * cp
    if world <= 0 or world % model:
        return None
    dp = sizes.get("dp", world // model)
    if dp * model != world:
        dp = world // model  # the world the job reported wins over a stale dp in the config
    order = _order(c.get("parallel_order")) or AXES
    source = "mesh" if c.get("parallel_order") is not None else "config"
    return ParallelLayout(tp, pp, dp, cp, sizes.get("ep", 1), sizes.get("vpp", 1), order, source)


def mesh_config(mesh: Any) -> dict[str, Any]:
    """The config keys of a ``torch.distributed.device_mesh.DeviceMesh`` (or anything with
    ``mesh_dim_names`` and ``shape``): ``tp``, ``pp``, ``dp``, ``cp``, ``ep`` and
    ``parallel_order``, for ``fleetlens.init(config={**config, **mesh_config(mesh)})``.
    Dimensions named for data parallelism (``dp_replicate``, ``dp_shard``, ``fsdp``...) multiply
    into ``dp``; a dimension with a name none of the frameworks use raises ValueError."""
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    shape = tuple(int(s) for s in getattr(mesh, "shape", ()))
    if not names or len(names) != len(shape):
        raise ValueError(
            "the mesh has no dimension names: name them "
            "(init_device_mesh(..., mesh_dim_names=('dp', 'tp')))"
        )
    out: dict[str, Any] = {}
    order: list[str] = []
    for name, size in zip(names, shape, strict=True):
        axis = next((a for a, known in _MESH_NAMES.items() if name.lower() in known), None)
        if axis is None:
            known = sorted({n for k in _MESH_NAMES.values() for n in k})
            raise ValueError(f"mesh dimension {name!r} is not one fleetlens knows: one of {known}")
        out[axis] = out.get(axis, 1) * size
        if axis in AXES and axis not in order:
            order.append(axis)
    out["parallel_order"] = order
    return out


_GROUP_AXES = {
    "pp": ("mesh_pp", "pipeline_model_parallel_group"),
    "tp": ("mesh_tp", "tensor_model_parallel_group"),
    "cp": ("mesh_cp", "context_parallel_group"),
    "ep": ("mesh_ep", "expert_model_parallel_group"),
    "dp": ("mesh_dp", "data_parallel_group"),
}
"""Process-group descriptions that name one parallel dimension: a ``DeviceMesh``'s (``mesh_`` and
the dimension's name) and Megatron-LM's ``group_desc``. A mesh's flattened dimensions
(``mesh_dp_cp``, ``mesh_dp_shard_cp``) span several axes and name none."""
_DP_PARTS = ("mesh_dp_replicate", "mesh_dp_shard")  # torchtitan's HSDP mesh: dp is their product


def groups_config(groups: Sequence[tuple[str, Sequence[int]]]) -> dict[str, Any]:
    """The config keys (``tp``, ``pp``, ``dp``, ``cp``, ``ep`` and ``parallel_order``) a rank's
    process groups give: each group's description and ranks, as a profiler trace records them
    (``distributedInfo.pg_config``). A dimension's size is its group's size; the order of the
    dimensions is their stride (the innermost's ranks are adjacent). Empty when no group names
    a model-parallel dimension."""
    found: dict[str, tuple[int, ...]] = {}
    for desc, ranks in groups:
        d = desc.lower()
        axis = next((a for a, names in _GROUP_AXES.items() if d in names), None)
        if axis is not None and axis not in found:
            found[axis] = tuple(sorted(int(r) for r in ranks))
    parts = [next((tuple(sorted(r)) for d, r in groups if d.lower() == p), None) for p in _DP_PARTS]
    if "dp" not in found and parts[0] is not None and parts[1] is not None:
        found["dp"] = tuple(sorted(set(parts[0]) | set(parts[1])))  # size: the product
        sizes_dp = len(parts[0]) * len(parts[1])
    else:
        sizes_dp = len(found.get("dp", ()))
    if not any(len(found.get(a, ())) > 1 for a in ("tp", "pp", "cp")):
        return {}
    out: dict[str, Any] = {}
    stride: dict[str, int] = {}
    for axis, ranks in found.items():
        size = sizes_dp if axis == "dp" else len(ranks)
        if size <= 1:
            continue
        out[axis] = size
        if axis in AXES:
            stride[axis] = min(b - a for a, b in pairwise(ranks))
    out["parallel_order"] = sorted(stride, key=lambda a: -stride[a])  # outermost first
    return out


def peer_normalize(compute: np.ndarray[Any, Any], stages: np.ndarray[Any, Any]) -> Any:
    """``compute`` (steps x ranks) with each pipeline stage's columns scaled so that their
    median, step by step, is the whole job's: a rank is then judged against the ranks of its
    own stage, and a stage that does more work by design reads as healthy. A stage of two
    ranks has no median that leaves a slow rank out: each is scaled by the other's time. Ranks
    past the layout (stage -1) and steps a stage did not report are left as they are."""
    if compute.size == 0 or stages.max(initial=-1) <= 0:
        return compute
    n = compute.shape[1]
    st = stages[:n] if len(stages) >= n else np.concatenate([stages, np.full(n - len(stages), -1)])
    out = compute.copy()
    with np.errstate(all="ignore"):
        whole = nanmedian(compute, axis=1)
        for s in np.unique(st[st >= 0]):
            cols = np.flatnonzero(st == s)
            med = nanmedian(compute[:, cols], axis=1)
            peer = np.broadcast_to(med[:, None], (len(med), len(cols)))
            if len(cols) == 2:  # each against the other (a slow one does not halve its lead)
                other = compute[:, cols[::-1]]
                peer = np.where(np.isfinite(other), other, peer)
            scale = np.where(np.isfinite(peer) & (peer > 0), whole[:, None] / peer, 1.0)
            out[:, cols] = compute[:, cols] * scale
    return out
