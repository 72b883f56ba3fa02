"""A decoded batch as the telemetry writer takes it: numpy columns per record kind.

The collector (:mod:`fleetlens.collector.decode`) produces it from the wire format after
validation; the store writes it. It lives here, in the lower layer, so that the store does not
import the collector.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Col", "DecodedBatch", "StringColumn"]


@dataclass(frozen=True)
class StringColumn:
    """A dictionary-encoded string column: ``values[i] == dictionary[codes[i]]``."""

    dictionary: list[str]
    codes: np.ndarray[Any, np.dtype[np.int32]]

    def values(self) -> list[str]:
        d = self.dictionary
        return [d[c] for c in self.codes.tolist()]


Col = np.ndarray[Any, Any] | StringColumn


@dataclass
class DecodedBatch:
    """A validated batch. ``tables`` holds the rows that passed the row rules; ``rejected``
    counts the rows refused, by the field that broke a rule, and ``errors`` says why (the first
    few). ``digests`` is a content hash per table of what the client sent (before any row was
    refused or any time corrected): what makes a retry recognisable. ``skew_s`` is the server's
    clock minus the sender's as measured from ``sent_at`` (0.0 when unknown), ``shift_s`` what
    was added to the batch's times to correct it. ``nbytes`` is the size of the decompressed
    body, which its columns are views of: what holding it costs."""

    batch_id: str
    ctx: dict[str, str]
    tables: dict[str, tuple[int, dict[str, Col]]]
    source: str = ""
    dropped: dict[str, int] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    skew_s: float = 0.0
    shift_s: float = 0.0
    nbytes: int = 0  # the decompressed body its columns are views of: the memory it holds

    @property
    def rows(self) -> int:
        return sum(n for n, _ in self.tables.values())
