"""The monitor's own counters on ``/metrics``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, Metric

if TYPE_CHECKING:
    from .monitor import Monitor

__all__ = ["MonitorMetrics"]


class MonitorMetrics:
    """The monitor's passes on ``/metrics`` (read at scrape): a wait for "N more passes" counts
    passes instead of sleeping, and a stalled monitor shows as a flat counter."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "fleetlens_monitor_passes",
            "Monitoring passes finished: analysis, alerts, remediation",
            value=self.monitor.passes,
        )
        yield CounterMetricFamily(
            "fleetlens_monitor_errors",
            "Steps of a pass that failed (logged, retried next pass)",
            value=self.monitor.errors,
        )
        yield CounterMetricFamily(
            "fleetlens_analysis_cursor_resets",
            "Runs whose analysis cursor was corrupt, analysed again from their first step",
            value=self.monitor.loop.cursor_resets,
        )
