"""Waiting for what becomes true eventually, without a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(
    probe: Callable[[], T | None], timeout: float = 60.0, every: float = 0.1, what: str = ""
) -> T:
    """Poll ``probe`` until it returns something truthy, and return that; fail after ``timeout``.

    For conditions that become true eventually (a background pass, a worker's progress): a
    deadline that is generous on a loaded machine instead of a fixed sleep, so the test waits no
    longer than it must and does not flake when the machine is slow.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what or 'condition'} not met within {timeout} s (last: {last!r})")


def monitor_passes(server: Any, token: str | None = None) -> int:
    """How many monitoring passes the server has finished (``fleetlens_monitor_passes_total``)."""
    status, text = server.request("GET", "/metrics", token=token)
    if status != 200:
        raise AssertionError(f"/metrics answered {status}: {text}")
    for line in str(text).splitlines():
        if line.startswith("fleetlens_monitor_passes_total "):
            return int(float(line.split()[1]))
    raise AssertionError("/metrics has no fleetlens_monitor_passes_total")


def wait_passes(server: Any, n: int = 2, timeout: float = 60.0, token: str | None = None) -> int:
    """Wait until the server has finished ``n`` more monitoring passes (the first may have begun
    before the call, so at least ``n - 1`` began after it): "later passes changed nothing" checks
    wait on passes, not on a sleep that passes when no pass ran."""
    start = monitor_passes(server, token)
    return wait_until(
        lambda: (p := monitor_passes(server, token)) >= start + n and p,
        timeout,
        what=f"{n} monitoring passes",
    )
