"""A finding's evidence as the API answers it: the entries' own keys in camelCase.

Below the API an evidence entry is stored with snake_case keys (:mod:`fleetlens.analysis.evidence`);
the answers carry them in camelCase. Only the keys named here are renamed, in an entry and in the
parts of it that are evidence's own shapes (its ``window``, a trace capture's ranks and their
heaviest kernels and collectives); every other key is kept as it is, and so is every value: a key
that is data (a rank under which its heartbeat is kept, the name of a device's memory statistic,
a node) is never touched, nor the snake_case keys the answers have always carried
(``memory_stats``, ``device_free_bytes``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["evidence_json"]

_CAMEL = {
    # the steps an entry covers
    "from_step": "fromStep",
    "to_step": "toStep",
    "last_step": "lastStep",
    # a straggler's slowdown, and how long the others waited for it
    "flagged_steps": "flaggedSteps",
    "wait_per_step_s": "waitPerStepS",
    "waited_for_median_s": "waitedForMedianS",
    # an out-of-memory error and a memory climb
    "seq_len": "seqLen",
    "batch_size": "batchSize",
    "requested_bytes": "requestedBytes",
    "used_bytes": "usedBytes",
    "limit_bytes": "limitBytes",
    "per_step_bytes": "perStepBytes",
    "steps_to_limit": "stepsToLimit",
    "from_bytes": "fromBytes",
    "to_bytes": "toBytes",
    # a data stall's dataset shard
    "stalled_rank_steps": "stalledRankSteps",
    "rank_steps": "rankSteps",
    "stalled_share": "stalledShare",
    # a GPU's signals
    "gpu_temp_max": "gpuTempMax",
    "sm_clock_ratio_min": "smClockRatioMin",
    "power_max": "powerMax",
    "bandwidth_min": "bandwidthMin",
    # a slowdown against the workload's baseline, a regression against earlier runs
    "baseline_median_s": "baselineMedianS",
    "others_ratio": "othersRatio",
    "baseline_runs": "baselineRuns",
    "baseline_software": "baselineSoftware",
    # a trace capture: each rank's mean milliseconds a step, its heaviest kernels
    "capture_id": "captureId",
    "host_only": "hostOnly",
    "step_ms": "stepMs",
    "compute_ms": "computeMs",
    "comm_ms": "commMs",
    "exposed_comm_ms": "exposedCommMs",
    "memcpy_ms": "memcpyMs",
    "idle_ms": "idleMs",
    "top_kernels": "topKernels",
    "top_collectives": "topCollectives",
    "total_ms": "totalMs",
}
"""Evidence's snake_case keys and the camelCase the answers carry them in."""

_PARTS = frozenset({"window", "ranks", "top_kernels", "top_collectives"})
"""The keys whose values are evidence's own shapes (an object, or a list of objects), named
the same way; a list of plain values (a fold's ranks) is kept as it is."""


def _entry(e: Mapping[str, Any]) -> dict[str, Any]:
    return {_CAMEL.get(k, k): _part(v) if k in _PARTS else v for k, v in e.items()}


def _part(v: Any) -> Any:
    if isinstance(v, Mapping):
        return _entry(v)
    if isinstance(v, Sequence) and not isinstance(v, str):
        return [_entry(x) if isinstance(x, Mapping) else x for x in v]
    return v


def evidence_json(evidence: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A finding's evidence entries as the answers carry them (an entry already in camelCase,
    as a client decodes an answer, is the same)."""
    return [_entry(e) for e in evidence]
