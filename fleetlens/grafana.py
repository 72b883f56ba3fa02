"""Grafana dashboards over the Prometheus metrics fleetlens exports (``GET /metrics``).

One per audience, for teams that live in Grafana: a run (the researcher: goodput, step time,
throughput, MFU, stragglers, where the step time goes, open findings), on-call (firing alerts,
faulty nodes, remediations, the runs that stopped stepping, the hottest GPUs, the collector's
health) and the fleet (the planner: live runs, goodput, throughput and MFU across runs, findings
by diagnosis, storage and ingest). ``fleetlens grafana --out DIR`` writes them as Grafana's
dashboard JSON with a provisioning file; every panel's PromQL is checked against a real
Prometheus scraping a real server (``tests/test_grafana.py``).

The series are job-level (no rank or step labels: docs/alerting.md); the dashboards take a
Prometheus data source (``$datasource``) and, where they show runs, ``$tenant`` and ``$run_id``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["DASHBOARDS", "dashboard", "targets", "write"]

_DS = {"type": "prometheus", "uid": "${datasource}"}
_RUN = 'tenant=~"$tenant", run_id=~"$run_id"'
_TENANT = 'tenant=~"$tenant"'


def _p(
    title: str, exprs: list[tuple[str, str]], unit: str, about: str, kind: str = "timeseries"
) -> dict[str, Any]:
    """A panel: its title, ``(expr, legend)`` targets, unit and description."""
    return {"title": title, "exprs": exprs, "unit": unit, "description": about, "type": kind}


DASHBOARDS: dict[str, dict[str, Any]] = {
    "fleetlens-run": {
        "title": "fleetlens: a run",
        "audience": "researcher",
        "vars": ("tenant", "run_id"),
        "panels": [
            _p("Goodput", [(f"fleetlens_run_goodput{{{_RUN}}}", "{{run_id}}")], "percentunit",
               "Runtime goodput over the sliding window: productive over held time"),
            _p("Step time", [(f"fleetlens_run_step_time_seconds{{{_RUN}}}",
                              "{{run_id}} {{stat}}")], "s",
               "The slowest rank's step time (max) and the mean rank's (median), recent steps"),
            _p("Tokens per second", [(f"fleetlens_run_tokens_per_second{{{_RUN}}}",
                                      "{{run_id}}")], "short", "Throughput, recent steps"),
            _p("MFU", [(f"fleetlens_run_mfu{{{_RUN}}}", "{{run_id}}")], "percentunit",
               "Model FLOPs utilization, recent steps (a logged mfu, else the config's FLOPs "
               "and accelerator)"),
            _p("Straggler spread", [(f"fleetlens_run_straggler_spread{{{_RUN}}}", "{{run_id}}"),
                                    (f"fleetlens_run_rank_step_time_ratio{{{_RUN}}} - 1",
                                     "{{run_id}} step time")], "percentunit",
               "The slowest rank's compute (and step time) over the mean rank's, minus 1"),
            _p("Where step time goes", [
                (f"fleetlens_run_communication_ratio{{{_RUN}}}", "{{run_id}} collectives"),
                (f"fleetlens_run_data_wait_ratio{{{_RUN}}}", "{{run_id}} data wait"),
            ], "percentunit", "Shares of the ranks' step time in collectives and data wait"),
            _p("Open findings", [(f"sum by (run_id, diagnosis) "
                                  f"(fleetlens_run_open_findings{{{_RUN}}})",
                                  "{{run_id}} {{diagnosis}}")], "short",
               "Findings of the analysis still open, by diagnosis (the run page says why)"),
            _p("Hottest GPU", [(f"fleetlens_run_gpu_temperature_max_celsius{{{_RUN}}}",
                                "{{run_id}}")], "celsius",
               "The hottest GPU the run's latest attempt is placed on, last 2 minutes"),
        ],
    },
    "fleetlens-oncall": {
        "title": "fleetlens: on-call",
        "audience": "on-call",
        "vars": ("tenant",),
        "panels": [
            _p("Firing alerts", [(f"sum by (severity, alertname) "
                                  f"(fleetlens_alerts_firing{{{_TENANT}}})",
                                  "{{severity}} {{alertname}}")], "short",
               "Firing alerts by severity and name (pages first on the portal's on-call page)"),
            _p("Nodes with faulty GPUs", [(f"fleetlens_node_gpu_faults{{{_TENANT}}}",
                                           "{{node}} {{class}}")], "short",
               "GPUs of a node with an open fault, fatal or recoverable", "bargauge"),
            _p("Remediations", [(f"sum by (state) (fleetlens_remediations{{{_TENANT}}})",
                                 "{{state}}")], "short",
               "Actions taking nodes out of runs, by state (awaiting approval, draining...)"),
            _p("Runs by time since their last step", [
                (f"topk(10, fleetlens_run_last_step_age_seconds{{{_TENANT}}})", "{{run_id}}")
            ], "s", "A run past a few step times without a step may be hung", "bargauge"),
            _p("Hottest GPUs", [(f"topk(10, fleetlens_run_gpu_temperature_max_celsius"
                                 f"{{{_TENANT}}})", "{{run_id}}")], "celsius",
               "The hottest GPU of each run, last 2 minutes", "bargauge"),
            _p("Lowest goodput", [(f"bottomk(10, fleetlens_run_goodput{{{_TENANT}}})",
                                   "{{run_id}}")], "percentunit",
               "The live runs losing the most of their held time", "bargauge"),
            _p("Collector", [
                ("sum by (outcome) (rate(fleetlens_ingest_batches_total[$__rate_interval]))",
                 "batches {{outcome}}"),
                ("rate(fleetlens_monitor_passes_total[$__rate_interval])", "analysis passes"),
            ], "ops", "Ingest batches by outcome (stored, refused...) and analysis passes"),
            _p("Storage free", [("fleetlens_storage_free_bytes", "free")], "bytes",
               "Free space of the data directory (ingest is refused below its floor)"),
        ],
    },
    "fleetlens-fleet": {
        "title": "fleetlens: the fleet",
        "audience": "capacity planner",
        "vars": ("tenant",),
        "panels": [
            _p("Live runs", [(f"count by (tenant) "
                              f"(fleetlens_run_last_step_age_seconds{{{_TENANT}}})",
                              "{{tenant}}")], "short", "Runs the server is following"),
            _p("Goodput across runs", [
                (f"avg by (tenant) (fleetlens_run_goodput{{{_TENANT}}})", "{{tenant}} mean"),
                (f"quantile by (tenant) (0.1, fleetlens_run_goodput{{{_TENANT}}})",
                 "{{tenant}} p10"),
            ], "percentunit", "The runs' runtime goodput: the mean and the worst tenth "
               "(GPU-hours by cause: the portal's Capacity page)"),
            _p("Tokens per second", [(f"sum by (tenant) "
                                      f"(fleetlens_run_tokens_per_second{{{_TENANT}}})",
                                      "{{tenant}}")], "short", "Throughput of all live runs"),
            _p("MFU across runs", [(f"quantile by (tenant) (0.5, fleetlens_run_mfu{{{_TENANT}}})",
                                    "{{tenant}} median")], "percentunit",
               "The median run's model FLOPs utilization"),
            _p("Open findings by diagnosis", [(f"sum by (diagnosis) "
                                               f"(fleetlens_run_open_findings{{{_TENANT}}})",
                                               "{{diagnosis}}")], "short",
               "What is costing the fleet now, by diagnosis"),
            _p("Stored telemetry", [("sum(fleetlens_stored_bytes)", "bytes on disk")], "bytes",
               "The telemetry store's bytes on disk"),
            _p("Ingest", [("sum by (kind) (rate(fleetlens_ingest_rows_total[$__rate_interval]))",
                           "{{kind}}")], "rowsps", "Rows stored per second, by kind"),
        ],
    },
}  # fmt: skip
"""Each dashboard: its title, audience, template variables and panels."""


def _variables(names: tuple[str, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"}
    ]
    for name in names:
        source = "fleetlens_run_last_step_age_seconds"
        if name == "tenant":
            query = f"label_values({source}, tenant)"
        else:  # the runs of the tenants chosen
            query = f'label_values({source}{{tenant=~"$tenant"}}, {name})'
        out.append(
            {
                "name": name,
                "type": "query",
                "datasource": _DS,
                "query": {"query": query, "refId": name},
                "refresh": 2,
                "includeAll": True,
                "multi": True,
                "allValue": ".*",
                "current": {"text": "All", "value": "$__all"},
            }
        )
    return out


def dashboard(uid: str) -> dict[str, Any]:
    """The dashboard ``uid`` as Grafana imports it (JSON model)."""
    spec = DASHBOARDS[uid]
    panels = []
    for i, p in enumerate(spec["panels"]):
        panels.append(
            {
                "id": i + 1,
                "type": p["type"],
                "title": p["title"],
                "description": p["description"],
                "datasource": _DS,
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": p["unit"]}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [
                    {"refId": chr(65 + j), "expr": expr, "legendFormat": legend, "datasource": _DS}
                    for j, (expr, legend) in enumerate(p["exprs"])
                ],
            }
        )
    return {
        "uid": uid,
        "title": spec["title"],
        "description": f"fleetlens for the {spec['audience']}, over the server's /metrics",
        "tags": ["fleetlens", spec["audience"]],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": _variables(spec["vars"])},
        "panels": panels,
    }


def targets(uid: str) -> list[tuple[str, str]]:
    """Every ``(panel title, expr)`` of the dashboard ``uid``."""
    return [(p["title"], t["expr"]) for p in dashboard(uid)["panels"] for t in p["targets"]]


PROVIDER = """apiVersion: 1
providers:
  - name: fleetlens
    folder: fleetlens
    type: file
    allowUiUpdates: true
    options:
      path: {path}
"""


def write(out: str | Path) -> list[Path]:
    """Write every dashboard (``UID.json``) and Grafana's provisioning file for them
    (``fleetlens-dashboards.yaml``: copy it to ``provisioning/dashboards/``) into ``out``."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for uid in DASHBOARDS:
        path = root / f"{uid}.json"
        tmp = path.with_suffix(".json.part")
        tmp.write_text(json.dumps(dashboard(uid), indent=2) + "\n")
        tmp.replace(path)
        written.append(path)
    provider = root / "fleetlens-dashboards.yaml"
    provider.write_text(PROVIDER.format(path=root.resolve()))
    written.append(provider)
    return written
