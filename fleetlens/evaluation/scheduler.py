"""The evaluation scheduler's decisions, as pure functions: how to split, in what order to lease.

An evaluation's suite is benchmarks with versions; each benchmark is split into shards of
``shard_size`` examples (evaluation_id + dataset partition). Workers lease shards in this order:
priority class (P0 safety certification, P1 release candidate, P2 researcher, P3 exploratory),
then the earliest deadline, then checkpoint locality (a shard of the model the worker already
holds), then age. The store turns :func:`lease_order` into SQL; the same ordering is here as a
Python key so that it can be tested on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

__all__ = ["NO_DEADLINE", "PRIORITIES", "ShardPlan", "lease_key", "parse_priority", "plan_shards"]

PRIORITIES = {"P0": 0, "P1": 1, "P2": 2, "P3": 3}
PRIORITY_NAMES = {v: k for k, v in PRIORITIES.items()}
NO_DEADLINE = 1e18  # sorts after every real deadline; a float column holds it on every engine


@dataclass(frozen=True)
class ShardPlan:
    index: int
    benchmark: str
    start: int
    stop: int


def parse_priority(value: str | int) -> int:
    if isinstance(value, int) and value in PRIORITY_NAMES:
        return value
    key = str(value).upper()
    if key not in PRIORITIES:
        raise ConfigError(
            f"priority {value!r} is unknown; use P0 (safety certification), P1 (release "
            "candidate), P2 (researcher) or P3 (exploratory)"
        )
    return PRIORITIES[key]


def plan_shards(sizes: Sequence[tuple[str, int]], shard_size: int) -> list[ShardPlan]:
    """Partition each benchmark (name, number of examples) into contiguous shards."""
    if shard_size < 1:
        raise ConfigError(f"shard_size {shard_size} must be >= 1")
    out: list[ShardPlan] = []
    for name, n in sizes:
        if n < 1:
            raise ConfigError(f"benchmark {name!r} has no examples")
        for start in range(0, n, shard_size):
            out.append(ShardPlan(len(out), name, start, min(n, start + shard_size)))
    return out


def lease_key(shard: dict[str, Any], prefer_locality: str = "") -> tuple[Any, ...]:
    """The order in which queued shards are handed out (smallest first)."""
    local = 0 if prefer_locality and shard.get("locality") == prefer_locality else 1
    return (
        int(shard["priority"]),
        float(shard.get("deadline") or NO_DEADLINE),
        local,
        float(shard.get("created_at", 0.0)),
        int(shard.get("shard_index", 0)),
    )
