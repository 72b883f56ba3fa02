"""A rank's memory over steps, judged: how much it uses, its peak, its headroom and its climb.

Two pools, as the SDK samples them (:mod:`fleetlens.sdk.memory`): the device's (what the CUDA
caching allocator holds, ``mem_reserved_bytes``, else what tensors hold, ``mem_allocated_bytes``,
against ``mem_total_bytes``) and the process's (``host_used_bytes`` against
``host_limit_bytes``). The headroom is the limit less the peak; the climb is the least-squares
slope of the pool's use over its newest :data:`SLOPE_POINTS` samples, in bytes a step, and at
that slope the steps left until the limit. A leak (a list that keeps every step's loss tensor and
its graph) is a steady climb; a model that fits is flat after its first steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "POOLS",
    "SLOPE_POINTS",
    "Climb",
    "PoolMemory",
    "climb",
    "pool_memory",
    "size_text",
    "steady",
]

POOLS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "device": (
        ("mem_reserved_bytes", "mem_allocated_bytes"),
        ("mem_reserved_bytes", "mem_max_allocated_bytes", "mem_allocated_bytes"),
        "mem_total_bytes",
    ),
    "host": (("host_used_bytes",), ("host_peak_bytes", "host_used_bytes"), "host_limit_bytes"),
}
"""Pool -> (the scalars that say its use, first found; those whose largest is its peak; its
limit)."""

SLOPE_POINTS = 50
"""The newest samples a climb is fitted over."""


@dataclass(frozen=True)
class Climb:
    """A pool's use over steps: where it started and ended, and its slope."""

    from_step: int
    from_bytes: float
    to_step: int
    to_bytes: float
    per_step: float | None  # least-squares bytes a step; None with fewer than two steps

    def text(self, limit: float | None) -> str:
        """``memory climbed from 1.10 GiB at step 0 to 3.80 GiB at step 40 (+69.1 MiB a step)
        of 4.00 GiB``, or ``held at ...`` when it did not rise."""
        rose = self.to_bytes > self.from_bytes * 1.05
        s = (
            f"memory climbed from {size_text(self.from_bytes)} at step {self.from_step} to "
            f"{size_text(self.to_bytes)} at step {self.to_step}"
            if rose
            else f"memory held at {size_text(self.to_bytes)} from step {self.from_step} to "
            f"{self.to_step}"
        )
        if rose and self.per_step:
            s += f" ({'+' if self.per_step > 0 else ''}{size_text(self.per_step)} a step)"
        return s + (f" of {size_text(limit)}" if limit else "")


@dataclass(frozen=True)
class PoolMemory:
    rank: int
    pool: str  # "device" or "host"
    used: float  # at the last sample
    peak: float
    limit: float | None
    headroom: float | None  # limit - peak
    climb: Climb | None
    steps_to_limit: float | None  # at the climb's slope, from the last sample; None if flat


def size_text(n: float) -> str:
    """Bytes as a reader takes them in: ``16.00 GiB``, ``4.0 MiB``, ``368 KiB``."""
    a = abs(n)
    if a >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB" if a >= 2**20 else f"{n / 2**10:.0f} KiB"


def climb(steps: Sequence[int], used: Sequence[float]) -> Climb | None:
    """The climb of one pool's use over ``steps`` (ascending); the slope over the newest
    :data:`SLOPE_POINTS`."""
    if not len(steps):
        return None
    xs, ys = list(steps[-SLOPE_POINTS:]), list(used[-SLOPE_POINTS:])
    per_step = None
    if len(xs) >= 2 and xs[-1] > xs[0]:
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        per_step = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return Climb(int(steps[0]), float(used[0]), int(steps[-1]), float(used[-1]), per_step)


def steady(steps: Sequence[int], used: Sequence[float], min_span: int = 20) -> bool:
    """Whether the newest :data:`SLOPE_POINTS` samples climb steadily: over at least
    ``min_span`` steps, and the newer half still climbing at half the older half's pace or
    more. A model's first steps (the allocator warming up, then flat) are not a climb."""
    xs, ys = list(steps[-SLOPE_POINTS:]), list(used[-SLOPE_POINTS:])
    if len(xs) < 4 or xs[-1] - xs[0] < min_span:
        return False
    half = len(xs) // 2
    older, newer = climb(xs[:half], ys[:half]), climb(xs[half:], ys[half:])
    if older is None or newer is None or not older.per_step or not newer.per_step:
        return False
    return older.per_step > 0 and newer.per_step >= 0.5 * older.per_step


def pool_memory(
    rank: int,
    pool: str,
    last: dict[str, float],
    peak: dict[str, float],
    steps: Sequence[int],
    used: Sequence[float],
) -> PoolMemory | None:
    """One rank's pool from its scalars' ``last`` and ``peak`` values (by name) and its use
    over ``steps``; None when the rank logged nothing of the pool."""
    use_names, peak_names, limit_name = POOLS[pool]
    name = next((n for n in use_names if n in last), None)
    if name is None:
        return None
    top = max(peak[n] for n in peak_names if n in peak)
    limit = last.get(limit_name)
    c = climb(steps, used)
    left = None
    if c is not None and c.per_step and c.per_step > 0 and limit:
        left = max(0.0, (limit - last[name]) / c.per_step)
    return PoolMemory(
        rank, pool, last[name], top, limit, None if limit is None else limit - top, c, left
    )
