"""The server's monitoring pass: analyse, evaluate the alert policy, notify, remediate, export.

One pass, run every ``analysis_interval_s`` by the server (off the event loop): the analysis
loop writes findings for runs with new data; for every active run the pass reads its signals
(progress, step time, goodput over the policy's window, findings, drains), evaluates the policy,
reconciles the alert store, hands notifications to the delivery thread, lets the remediation
controller decide and move its actions on (fleetlens.remediation), stores the run's
sliding-window goodput as a scalar series (``goodput``), refreshes the Prometheus snapshot and
copies due failure windows. A failure in one run is logged and the pass goes on.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import yaml
from sqlalchemy import select

from .alerts.engine import RESOLVE_STEPS, RunSignals, evaluate
from .alerts.metrics import JobMetrics, RunMetrics
from .alerts.notifiers import (
    AlertmanagerNotifier,
    Delivery,
    Notifier,
    SlackNotifier,
    WebhookNotifier,
)
from .alerts.policy import DEFAULT_POLICY, Policy
from .alerts.preserve import preserve_window
from .alerts.store import AlertStore
from .analyzer import analyze_once
from .config import ServerConfig
from .errors import ConfigError
from .remediation.actuators import build_actuators
from .remediation.controller import Controller
from .remediation.policy import RemediationPolicy
from .store.access import AccessStore
from .store.findings import FindingsStore
from .store.goodput_queries import goodput_window
from .store.metadata import MetadataStore, run_status
from .store.models import Run
from .store.run_queries import RunQueries
from .store.scope import Scope
from .store.telemetry import TelemetryStore

__all__ = ["Monitor", "MonitorConfig"]

log = logging.getLogger("fleetlens.monitor")


@dataclass(frozen=True)
class MonitorConfig:
    active_s: float = 3600.0  # runs seen within this long are evaluated
    goodput_every_s: float = 60.0  # a goodput sample per run at most this often
    goodput_window_s: float = 1800.0
    max_runs: int = 500


@dataclass
class Monitor:
    telemetry: TelemetryStore
    metadata: MetadataStore
    findings: FindingsStore
    alerts: AlertStore
    delivery: Delivery
    metrics: JobMetrics
    policy: Policy
    project_overrides: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    config: MonitorConfig = field(default_factory=MonitorConfig)
    remediation: Controller | None = None
    _goodput: dict[tuple[str, str], deque[tuple[float, float]]] = field(default_factory=dict)
    passes: int = 0
    errors: int = 0

    @classmethod
    def build(
        cls,
        cfg: ServerConfig,
        telemetry: TelemetryStore,
        metadata: MetadataStore,
        access: AccessStore,
        metrics: JobMetrics,
    ) -> Monitor:
        """The monitor a server config asks for: notifiers, policy overrides, stores."""
        notifiers: list[Notifier] = []
        if cfg.alertmanager_url:
            notifiers.append(AlertmanagerNotifier(cfg.alertmanager_url))
        if cfg.webhook_url:
            notifiers.append(WebhookNotifier(cfg.webhook_url))
        if cfg.slack_url:
            notifiers.append(SlackNotifier(cfg.slack_url))
        policy, projects = DEFAULT_POLICY, {}
        if cfg.alert_policy:
            try:
                with open(cfg.alert_policy) as fh:
                    doc = yaml.safe_load(fh) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise ConfigError(f"cannot read alert policy {cfg.alert_policy}: {exc}") from exc
            policy = policy.merged(doc.get("rules", {}))
            projects = dict(doc.get("projects", {}))
            for overrides in projects.values():
                policy.merged(overrides)  # validate now, not at the first alert
        findings = FindingsStore(metadata)
        controller = Controller(
            metadata,
            telemetry,
            findings,
            access,
            RemediationPolicy(
                mode=cfg.remediation,
                restart_cost_s=cfg.restart_cost_s,
                persist_s=cfg.straggler_persist_s,
            ),
            build_actuators(cfg.actuators),
            hang_s=cfg.hang_s,
        )
        return cls(
            telemetry,
            metadata,
            findings,
            AlertStore(metadata, access, cfg.public_url),
            Delivery(notifiers),
            metrics,
            policy,
            projects,
            remediation=controller,
        )

    def close(self) -> None:
        self.delivery.close()

    def policy_for(self, project: str, run_config: dict[str, Any]) -> Policy:
        """The default policy, then the project's overrides, then the run's own."""
        p = self.policy
        if project in self.project_overrides:
            p = p.merged(self.project_overrides[project])
        own = run_config.get("fleetlens_alerts") if isinstance(run_config, dict) else None
        if isinstance(own, dict):
            try:
                p = p.merged(own)
            except Exception:  # a bad override in a run's config must not stop alerting
                log.warning("ignoring invalid fleetlens_alerts in a run's config")
        return p

    def run_once(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        try:
            analyze_once(self.telemetry, self.findings, now)
        except Exception:
            self.errors += 1
            log.exception("analysis pass failed")
        runs = self._active_runs(now)
        snapshot: list[RunMetrics] = []
        by_tenant: dict[str, tuple[list[str], list[Any]]] = {}
        for run in runs:
            try:
                signals, metrics = self._signals(run, now)
            except Exception:
                self.errors += 1
                log.exception("monitoring run %s failed", run.run_id)
                continue
            snapshot.append(metrics)
            policy = self.policy_for(run.project, dict(run.config or {}))
            ids, cands = by_tenant.setdefault(run.tenant, ([], []))
            ids.append(run.run_id)
            cands.extend(evaluate(policy, signals))
        for tenant, (ids, cands) in by_tenant.items():
            try:
                self.delivery.submit(self.alerts.apply(tenant, ids, cands, now))
            except Exception:
                self.errors += 1
                log.exception("alert reconciliation failed for tenant %s", tenant)
        try:
            if self.remediation is not None:
                self.remediation.tick(runs, now)
        except Exception:
            self.errors += 1
            log.exception("remediation pass failed")
        self._export(snapshot)
        self._preserve(now)
        self.passes += 1

    def _active_runs(self, now: float) -> list[Run]:
        with self.metadata._session() as s:
            rows = s.scalars(
                select(Run)
                .where(Run.last_seen >= now - self.config.active_s)
                .order_by(Run.last_seen.desc())
                .limit(self.config.max_runs)
            ).all()
            return list(rows)

    def _signals(self, run: Run, now: float) -> tuple[RunSignals, RunMetrics]:
        scope = Scope(tenant=run.tenant, role="viewer", actor="monitor")
        q = RunQueries(self.telemetry, scope)
        summary = q.summary(run.run_id, window=50)
        last = self.telemetry.query(
            f"SELECT max(`end`) AS t FROM {self.telemetry.database}.steps_by_step "
            "WHERE tenant = {tenant:String} AND run_id = {run:String}",
            {"tenant": run.tenant, "run": run.run_id},
        ).to_pylist()[0]["t"]
        last_end = float(last) if last else None
        step_ms = summary.get("metrics", {}).get("stepTimeMs")
        findings = self.findings.list(scope, run.run_id)
        stops = self.telemetry.query(
            f"SELECT time, node_id, kind FROM {self.telemetry.database}.events WHERE tenant = "
            "{tenant:String} AND run_id = {run:String} AND kind IN ('drain', 'maintenance', "
            "'failure', 'preemption', 'finish', 'restart')",
            {"tenant": run.tenant, "run": run.run_id},
        ).to_pylist()
        drains = [(float(r["time"]), str(r["node_id"])) for r in stops
                  if r["kind"] in ("drain", "maintenance")]  # fmt: skip
        stopped = [float(r["time"]) for r in stops if r["kind"] != "restart"]
        status = run_status(run.status, run.status_at, run.last_seen, now)
        series = self._goodput_series(run, now, status)
        open_findings: dict[str, int] = {}
        for f in findings:
            end = f.get("endStep")
            if end is None or summary.get("step") is None or summary["step"] - end <= RESOLVE_STEPS:
                open_findings[f["diagnosis"]] = open_findings.get(f["diagnosis"], 0) + 1
        signals = RunSignals(
            tenant=run.tenant,
            run_id=run.run_id,
            project=run.project,
            now=now,
            status=status,
            last_step=int(summary.get("step") or -1),
            last_step_end=last_end,
            step_time=step_ms / 1000.0 if step_ms else None,
            goodput=list(series),
            findings=findings,
            drains=drains,
            stopped_at=max(stopped) if stopped else None,
        )
        m = summary.get("metrics", {})
        metrics = RunMetrics(
            tenant=run.tenant,
            project=run.project,
            run_id=run.run_id,
            goodput=series[-1][1] if series else None,
            step_time_max=step_ms / 1000.0 if step_ms else None,
            step_time_median=(m.get("meanRankStepTimeMs") or 0) / 1000.0 or None,
            tokens_per_s=m.get("tokensPerSecond"),
            mfu=m.get("mfu"),
            last_step_age_s=(now - last_end) if last_end else None,
            findings=open_findings,
        )
        return signals, metrics

    def _goodput_series(self, run: Run, now: float, status: str) -> deque[tuple[float, float]]:
        key = (run.tenant, run.run_id)
        series = self._goodput.setdefault(key, deque(maxlen=512))
        if status not in ("RUNNING", "STALLED"):
            return series
        if series and now - series[-1][0] < self.config.goodput_every_s:
            return series
        w = goodput_window(
            self.telemetry, run.tenant, run.run_id, self.config.goodput_window_s, now
        )
        g = w.get("jobProduct")
        if g is None or not math.isfinite(g):
            return series
        series.append((now, float(g)))
        # Stored beside the run's scalars, so dashboards read goodput over time too.
        table = pa.table(
            {
                "step": pa.array([max(run.last_step, 0)], pa.int64()),
                "rank": pa.array([0], pa.int32()),
                "time": pa.array([now]),
                "name": pa.array(["goodput"]),
                "value": pa.array([float(g)]),
            }
        )
        self.telemetry.insert(
            "scalar",
            table,
            {"tenant": run.tenant, "project": run.project, "run_id": run.run_id},
            f"goodput-{run.run_id}-{int(now)}",
        )
        return series

    def _export(self, runs: list[RunMetrics]) -> None:
        firing: dict[tuple[str, str], int] = {}
        faults: dict[tuple[str, str, str], int] = {}
        for tenant in {r.tenant for r in runs}:
            scope = Scope(tenant=tenant, role="viewer", actor="monitor")
            for a in self.alerts.list(scope, state="firing", limit=10_000):
                key = (a["alertname"], a["severity"])
                firing[key] = firing.get(key, 0) + 1
                node = a["labels"].get("node")
                if node and a["alertname"] in ("FatalHardwareFault", "RecoverableHardwareFault"):
                    cls = "fatal" if a["severity"] == "page" else "recoverable"
                    faults[(tenant, node, cls)] = faults.get((tenant, node, cls), 0) + 1
        states = self.remediation.state_counts() if self.remediation is not None else {}
        self.metrics.update(runs, firing, faults, states)

    def _preserve(self, now: float) -> None:
        for p in self.alerts.pending_preservations(now):
            until = min(p.t1, now)
            try:
                preserve_window(
                    self.telemetry,
                    p.tenant,
                    p.run_id,
                    list(p.nodes),
                    p.copied_until,
                    until,
                    f"preserve-{p.id}-{p.copied_until:.3f}",
                )
                self.alerts.mark_preserved(p.id, until)
            except Exception:
                self.errors += 1
                log.exception("preserving failure window %s failed", p.id)
