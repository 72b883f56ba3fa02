"""Per-tenant ingest rate limits: a token bucket in bytes per second, checked before the body.

A tenant over its rate gets 429 with the time until its bucket has room again, and because the
check happens before the body is decoded or stored, a noisy tenant costs the others little.
A bucket may go into debt by one batch, so a batch larger than the burst is never starved.
"""

from __future__ import annotations

import threading
import time

__all__ = ["TenantLimiter"]


class TenantLimiter:
    def __init__(self, burst_s: float = 2.0) -> None:
        self.burst_s = burst_s
        self._rates: dict[str, float] = {}
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def set_rate(self, tenant: str, bytes_per_s: float) -> None:
        with self._lock:
            if bytes_per_s <= 0:
                self._rates.pop(tenant, None)
                self._buckets.pop(tenant, None)
            elif self._rates.get(tenant) != bytes_per_s:
                self._rates[tenant] = bytes_per_s
                self._buckets[tenant] = (bytes_per_s * self.burst_s, time.monotonic())

    def tenants(self) -> list[str]:
        with self._lock:
            return list(self._rates)

    def take(self, tenant: str, nbytes: int, now: float | None = None) -> float:
        """Charge ``nbytes``; 0.0 if allowed, else the seconds to wait before retrying."""
        now = time.monotonic() if now is None else now
        with self._lock:
            rate = self._rates.get(tenant)
            if rate is None:
                return 0.0
            tokens, last = self._buckets[tenant]
            tokens = min(rate * self.burst_s, tokens + (now - last) * rate)
            if tokens <= 0:
                self._buckets[tenant] = (tokens, now)
                return -tokens / rate + 1e-3
            self._buckets[tenant] = (tokens - nbytes, now)
            return 0.0
