"""Server-directed pacing: each acknowledgement tells its sender how often to flush.

A job's size is not the server's to choose, but its request rate is: every SDK sends one request
per flush, so the flush interval sets it. The sender says what it uses now
(``X-Fleetlens-Flush-S``); the server measures the requests of the last seconds against the rate
it can hold (``[collector] max_request_rate``) and answers ``flushS``: the same interval scaled by
the square root of the overload (a damped step, so a thousand senders reacting at once converge
instead of oscillating), and shorter again once the load falls. The SDK keeps its configured
interval as the floor and 60 s as the ceiling. A backlog of waiting inserts counts as overload
too: it means the rate is already more than the store takes.
"""

from __future__ import annotations

import math
import time

__all__ = ["Pacer"]

_WINDOW_S = 5
MAX_FLUSH_S = 60.0


class Pacer:
    """Counts requests per second over a few seconds; advises flush intervals."""

    def __init__(self, max_request_rate: float) -> None:
        self.max_request_rate = max(1.0, max_request_rate)
        self._buckets = [0] * _WINDOW_S
        self._second = 0

    def observe(self, now: float | None = None) -> None:
        """One request arrived (called on the event loop: no lock)."""
        sec = int(now if now is not None else time.monotonic())
        self._roll(sec)
        self._buckets[sec % _WINDOW_S] += 1

    def _roll(self, sec: int) -> None:
        if sec != self._second:
            for s in range(max(self._second + 1, sec - _WINDOW_S + 1), sec + 1):
                self._buckets[s % _WINDOW_S] = 0
            self._second = sec

    def rate(self, now: float | None = None) -> float:
        """Requests per second over the last complete seconds."""
        sec = int(now if now is not None else time.monotonic())
        self._roll(sec)
        done = sum(self._buckets) - self._buckets[sec % _WINDOW_S]
        return done / (_WINDOW_S - 1)

    def advise(
        self, current_s: float | None, backlog: float = 0.0, now: float | None = None
    ) -> float:
        """The flush interval to use next, for a sender flushing every ``current_s`` seconds;
        ``backlog`` is the fraction of the ingest queue in use."""
        current = current_s if current_s and math.isfinite(current_s) and current_s > 0 else 1.0
        load = self.rate(now) / self.max_request_rate
        if backlog > 0.5:
            load = max(load, 2.0 * backlog)
        return round(min(MAX_FLUSH_S, current * math.sqrt(max(load, 1e-3))), 3)
