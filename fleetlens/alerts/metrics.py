"""``/metrics`` for an existing Prometheus: job-level series only, with a cardinality limit.

Labels are bounded: tenant, project, run, node, GPU, diagnosis, alert name, severity; never a
step, a rank-step or a prompt. The server loop hands in a snapshot; scraping reads it. Past
``max_runs`` runs (or ``max_nodes`` nodes) a family refuses new label sets, and
``fleetlens_metrics_series_refused_total`` counts what it refused.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .policy import METRICS

__all__ = ["SAMPLED_METRICS", "JobMetrics", "RunMetrics", "StorageMetrics", "TenantView"]

_RUN = ["tenant", "project", "run_id"]


@dataclass
class RunMetrics:
    tenant: str
    project: str
    run_id: str
    goodput: float | None = None
    step_time_max: float | None = None
    step_time_median: float | None = None
    spread: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    last_step_age_s: float | None = None
    # the seed's per-metric alert inputs (policy.METRICS), recent steps
    gpu_temp_max: float | None = None
    comm_ratio: float | None = None
    data_wait_ratio: float | None = None
    rank_step_ratio: float | None = None
    prefetch_empty_share: float | None = None
    storage_read_p99_s: float | None = None
    findings: dict[str, int] = field(default_factory=dict)  # diagnosis -> open findings


_METRIC_DOCS = {
    "gpu_temp_max": "Hottest GPU the run's latest attempt is placed on, last 2 minutes",
    "comm_ratio": "Share of the ranks' step time spent in collectives, recent steps",
    "data_wait_ratio": "Share of the ranks' step time spent waiting for data, recent steps",
    "rank_step_ratio": "Slowest rank's step time over the mean rank's, recent steps",
    "prefetch_empty_share": "Share of recent rank-steps whose prefetch queue was empty",
    "storage_read_p99_s": "p99 of the ranks' storage read latency, recent steps",
}

SAMPLED_METRICS = frozenset(_METRIC_DOCS)
"""The RunMetrics fields the monitor fills from its per-metric series (the rest from the run's
summary and goodput)."""


class JobMetrics(Collector):
    def __init__(self, max_runs: int = 2000, max_nodes: int = 20000) -> None:
        self.max_runs = max_runs
        self.max_nodes = max_nodes
        self.refused = 0
        self._lock = threading.Lock()
        self._runs: list[RunMetrics] = []
        self._alerts: dict[tuple[str, str, str], int] = {}
        self._node_faults: dict[tuple[str, str, str], int] = {}
        self._remediations: dict[tuple[str, str], int] = {}

    def update(
        self,
        runs: list[RunMetrics],
        alerts: dict[tuple[str, str, str], int],
        node_faults: dict[tuple[str, str, str], int],
        remediations: dict[tuple[str, str], int] | None = None,
    ) -> None:
        """Replace the snapshot; series beyond the limits are refused and counted."""
        refused = max(0, len(runs) - self.max_runs) + max(0, len(node_faults) - self.max_nodes)
        kept_nodes = dict(list(node_faults.items())[: self.max_nodes])
        with self._lock:
            self._runs = runs[: self.max_runs]
            self._alerts = dict(alerts)
            self._node_faults = kept_nodes
            self._remediations = dict(remediations or {})
            self.refused += refused

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            runs, alerts, faults, refused = (
                list(self._runs),
                dict(self._alerts),
                dict(self._node_faults),
                self.refused,
            )
            remediations = dict(self._remediations)
        gauges: dict[str, tuple[str, str]] = {
            "goodput": (
                "fleetlens_run_goodput",
                "Runtime goodput over the sliding window (productive / held time)",
            ),
            "spread": (
                "fleetlens_run_straggler_spread",
                "Slowest rank's compute over the mean rank's, minus 1, recent steps",
            ),
            "tokens_per_s": ("fleetlens_run_tokens_per_second", "Tokens per second, recent steps"),
            "mfu": (
                "fleetlens_run_mfu",
                "Model FLOPs utilization, recent steps (a logged mfu scalar, else the config's "
                "FLOPs and accelerator)",
            ),
            "last_step_age_s": (
                "fleetlens_run_last_step_age_seconds",
                "Seconds since the run's last step ended",
            ),
        }
        gauges.update({m: (METRICS[m], doc) for m, doc in _METRIC_DOCS.items()})
        for attr, (name, doc) in gauges.items():
            fam = GaugeMetricFamily(name, doc, labels=_RUN)
            for r in runs:
                v = getattr(r, attr)
                if v is not None:
                    fam.add_metric([r.tenant, r.project, r.run_id], float(v))
            yield fam
        st = GaugeMetricFamily(
            "fleetlens_run_step_time_seconds",
            "Recent job step time: the slowest rank (max) and the mean rank",
            labels=[*_RUN, "stat"],
        )
        for r in runs:
            for stat, v in (("max", r.step_time_max), ("median", r.step_time_median)):
                if v is not None:
                    st.add_metric([r.tenant, r.project, r.run_id, stat], float(v))
        yield st
        fi = GaugeMetricFamily(
            "fleetlens_run_open_findings",
            "Findings of the analysis still open, by diagnosis",
            labels=[*_RUN, "diagnosis"],
        )
        for r in runs:
            for diagnosis, n in sorted(r.findings.items()):
                fi.add_metric([r.tenant, r.project, r.run_id, diagnosis], float(n))
        yield fi
        al = GaugeMetricFamily(
            "fleetlens_alerts_firing",
            "Firing alerts by tenant, name and severity",
            labels=["tenant", "alertname", "severity"],
        )
        for (tenant, name, sev), n in sorted(alerts.items()):
            al.add_metric([tenant, name, sev], float(n))
        yield al
        nf = GaugeMetricFamily(
            "fleetlens_node_gpu_faults",
            "GPUs of a node with an open fault, by class",
            labels=["tenant", "node", "class"],
        )
        for (tenant, node, cls), n in sorted(faults.items()):
            nf.add_metric([tenant, node, cls], float(n))
        yield nf
        rm = GaugeMetricFamily(
            "fleetlens_remediations",
            "Remediation actions (auto-cordon) by state: awaiting_approval, draining, resumed, ...",
            labels=["tenant", "state"],
        )
        for (tenant, state), n in sorted(remediations.items()):
            rm.add_metric([tenant, state], float(n))
        yield rm
        yield CounterMetricFamily(
            "fleetlens_metrics_series_refused",
            "Label sets refused by the cardinality limit",
            value=refused,
        )

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"runs": len(self._runs), "refused": self.refused}


class StorageMetrics:
    """``fleetlens_stored_bytes{table=...}``: the telemetry store's bytes on disk per table
    (active parts), read at scrape time. The operator's alone: it names no tenant."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes

    def collect(self) -> Iterator[Metric]:
        fam = GaugeMetricFamily(
            "fleetlens_stored_bytes",
            "Telemetry bytes on disk per table (raw, rollups, preserved windows)",
            labels=["table"],
        )
        for table, n in sorted(self.sizes.items()):
            fam.add_metric([table], float(n))
        yield fam


class TenantView:
    """A registry's metrics as one caller may see them.

    A tenant's caller sees only samples labelled with its tenant, and a project-scoped one only
    those labelled with its project too: a sample without the label (the server's own counters) or
    with another tenant's is left out. ``infra_only`` (the
    on-call role) sees every tenant's samples that name no run: nodes, remediations, alerts.
    """

    def __init__(
        self, registry: Any, tenant: str, project: str = "", *, infra_only: bool = False
    ) -> None:
        self.registry = registry
        self.tenant = tenant
        self.project = project
        self.infra_only = infra_only

    def _visible(self, labels: dict[str, str]) -> bool:
        if self.infra_only:
            return "run_id" not in labels and "project" not in labels
        if labels.get("tenant") != self.tenant:
            return False
        return not self.project or labels.get("project") == self.project

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            family.samples = [s for s in family.samples if self._visible(s.labels)]
            yield family
