"""A finding's evidence: what it measured, as JSON values under snake_case keys.

Each entry says what a finding rests on: a metric and its value against a baseline over a window
of steps, a GPU's signal, an event's message. Entries are stored as they are (the findings
table's ``evidence`` column) and read back by the API, which names their keys in camelCase
(:mod:`fleetlens.api.evidence`). A value keyed by data (a rank's heartbeat under its rank, a
device's memory statistics under their names) is carried as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

__all__ = ["Evidence", "JSONValue", "window"]

JSONValue: TypeAlias = (
    str | int | float | bool | Sequence["JSONValue"] | Mapping[str, "JSONValue"] | None
)
"""A value JSON can hold."""

Evidence: TypeAlias = dict[str, JSONValue]
"""One evidence entry of a finding."""


def window(from_step: int, to_step: int) -> Evidence:
    """The steps an entry's figures cover (both included; ``to_step`` -1: ongoing)."""
    return {"from_step": from_step, "to_step": to_step}
