"""Server-directed pacing: each acknowledgement tells its sender how often to flush.

A job's size is not the server's to choose, but its request rate is: every SDK sends one request
per flush, so the flush interval sets it. Each sender says how often it really sends
(``X-Fleetlens-Flush-S``: the seconds since its previous request, its wait plus its work against
a slow server; :class:`fleetlens.sdk.transport.Cadence`). A sender sending every ``i`` seconds
sends ``W / i`` requests in a window of ``W`` seconds, so the sum of the stated seconds of the
window's requests, over ``W``, counts the senders whatever their intervals. The answer
(``flushS``) is the interval that spreads those senders to the rate the server holds
(``[collector] max_request_rate``): the same for every sender, so a thousand of them converge
in one window instead of each reacting to the others' reactions. The SDK keeps its configured
interval as the floor and 60 s as the ceiling. A backlog of waiting requests stretches it
further: the store is already taking less than arrives.
"""

from __future__ import annotations

import math
import time
from typing import Any

__all__ = ["Pacer"]

_WINDOW_S = 5
MAX_FLUSH_S = 60.0


class Pacer:
    """Requests and their senders' stated intervals, per second over a few seconds."""

    def __init__(self, max_request_rate: float) -> None:
        self.max_request_rate = max(1.0, max_request_rate)
        self._count = [0] * _WINDOW_S
        self._spans = [0.0] * _WINDOW_S
        self._second = 0

    def observe(self, interval_s: float | None, now: float | None = None) -> None:
        """One request arrived from a sender flushing every ``interval_s`` (called on the
        event loop: no lock)."""
        sec = int(now if now is not None else time.monotonic())
        self._roll(sec)
        i = interval_s if interval_s and math.isfinite(interval_s) and interval_s > 0 else 1.0
        self._count[sec % _WINDOW_S] += 1
        self._spans[sec % _WINDOW_S] += min(i, MAX_FLUSH_S)

    def _roll(self, sec: int) -> None:
        if sec != self._second:
            for s in range(max(self._second + 1, sec - _WINDOW_S + 1), sec + 1):
                self._count[s % _WINDOW_S] = 0
                self._spans[s % _WINDOW_S] = 0.0
            self._second = sec

    def _done(self, values: list[Any], sec: int) -> float:
        return float(sum(values) - values[sec % _WINDOW_S])

    def rate(self, now: float | None = None) -> float:
        """Requests per second over the last complete seconds."""
        sec = int(now if now is not None else time.monotonic())
        self._roll(sec)
        return self._done(self._count, sec) / (_WINDOW_S - 1)

    def senders(self, now: float | None = None) -> float:
        """How many senders the last complete seconds' requests came from."""
        sec = int(now if now is not None else time.monotonic())
        self._roll(sec)
        return self._done(self._spans, sec) / (_WINDOW_S - 1)

    def advise(self, backlog: float = 0.0, now: float | None = None) -> float:
        """The flush interval every sender should use; ``backlog`` is the fraction of the
        ingest queue in use."""
        interval = self.senders(now) / self.max_request_rate
        if backlog > 0.5:
            interval *= 1.0 + backlog
        return round(min(MAX_FLUSH_S, interval), 3)
