"""A rank's captured steps summed up (:func:`fleetlens.traces.capture.rank_summary`): the
value a capture keeps for each rank once its trace is in, stored in the capture's row as a
JSON object whose keys are the fields' camelCase names.

This module is light (msgspec only): the metadata store reads it back.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["RankSummary", "TopCollective", "TopKernel", "decode_summary", "snake_fields"]


class TopKernel(msgspec.Struct, frozen=True, rename="camel"):
    """One of the heaviest kernels of the captured steps (summed over them)."""

    name: str
    category: str
    calls: int
    total_ms: float


class TopCollective(msgspec.Struct, frozen=True, rename="camel"):
    """One of the collectives of the captured steps with the most time."""

    op: str
    calls: int
    total_ms: float


class RankSummary(msgspec.Struct, frozen=True, rename="camel"):
    """Mean milliseconds a captured step per line (compute, communication, the part of it not
    hidden behind compute, memory copies, idle), the steps' span and the trace's clock.
    ``host_only``: the trace has no device activity (CPU training, gloo): ``compute_ms`` is then
    the host's own work and ``idle_ms`` is None. ``steps`` 0: the trace held no step."""

    steps: int
    from_step: int | None = None
    to_step: int | None = None
    clock: str | None = None
    host_only: bool = False
    step_ms: float | None = None
    compute_ms: float | None = None
    comm_ms: float | None = None
    exposed_comm_ms: float | None = None
    memcpy_ms: float | None = None
    idle_ms: float | None = None
    kernels: int | None = None
    collectives: int | None = None
    top_kernels: tuple[TopKernel, ...] = ()
    top_collectives: tuple[TopCollective, ...] = ()

    def stored(self) -> dict[str, Any]:
        """The JSON object the capture's row keeps (camelCase keys)."""
        return msgspec.json.decode(msgspec.json.encode(self))  # type: ignore[no-any-return]


def decode_summary(stored: object) -> RankSummary:
    """A rank's summary as a capture's row keeps it (:meth:`RankSummary.stored`)."""
    return msgspec.convert(stored, RankSummary)


def snake_fields(value: msgspec.Struct) -> dict[str, Any]:
    """``value``'s fields by their snake_case names, nested values too: a summary as a finding's
    evidence carries it (the API names its keys)."""
    return {f: _plain(getattr(value, f)) for f in value.__struct_fields__}


def _plain(value: Any) -> Any:
    if isinstance(value, msgspec.Struct):
        return snake_fields(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value
