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

from ..alerts.engine import (
    RESOLVE_STEPS,
    EvaluationSignals,
    RunSignals,
    evaluate,
    evaluate_evaluation,
)
from ..alerts.metrics import SAMPLED_METRICS, JobMetrics, RunMetrics
from ..alerts.notifiers import (
    AlertmanagerNotifier,
    Delivery,
    Notifier,
    SlackNotifier,
    WebhookNotifier,
)
from ..alerts.policy import DEFAULT_POLICY, Policy
from ..alerts.preserve import preserve_window
from ..alerts.store import AlertStore
from ..analysis.hangs import HangRule
from ..config import AnalyzerConfig, MonitorConfig, ServerConfig
from ..errors import ConfigError
from ..evaluation.models import Evaluation
from ..lifecycle import LIVE
from ..remediation.actuators import build_actuators
from ..remediation.controller import Controller
from ..remediation.policy import RemediationPolicy
from ..store.access import AccessStore
from ..store.findings import FindingRow, FindingsStore
from ..store.metadata import MetadataStore
from ..store.models import Run
from ..store.reader import TenantReader
from ..store.run_queries import RunTelemetryQueries
from ..store.scope import Scope
from ..store.scoped import all_tenants
from ..store.telemetry import TelemetryStore
from .analyzer import LoopCounts, analyze_once
from .captures import Captures
from .goodput import goodput_window, summary_mfu
from .monitor_metrics import MonitorMetrics
from .portal import PortalQueries
from .portal_types import RecentSpread
from .regressions import Regressions
from .run_signals import metric_samples
from .runs import RunQueries
from .runs_types import RunSummary

__all__ = ["Monitor", "MonitorMetrics"]

log = logging.getLogger("fleetlens.monitor")

_STOP_KINDS = (
    "drain",
    "maintenance",
    "failure",
    "preemption",
    "finish",
    "restart",
    "checkpoint_begin",
    "checkpoint_end",
)
"""The events a run's signals read: drains, stops and restarts, checkpoints (progress)."""
_REGRESSION_RETRY_S = 5.0


@dataclass(frozen=True)
class _RunReads:
    """A run's steps and scalars as its signals read them, as of its ``arrivals`` (bumped once
    data it sent is stored, whatever its times): a quiet run costs a pass few queries. Events (a
    drain the server writes is one), status and goodput are read or judged every pass."""

    arrivals: int
    summary: RunSummary
    last_end: float | None
    spread: RecentSpread | None


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
    analyzer: AnalyzerConfig = field(default_factory=AnalyzerConfig)
    remediation: Controller | None = None
    captures: Captures | None = None
    regressions: Regressions | None = None
    _judged: dict[tuple[str, str], float] = field(default_factory=dict)
    _goodput: dict[tuple[str, str], deque[tuple[float, float]]] = field(default_factory=dict)
    # per run, each per-metric alert input over time (run_signals.metric_samples)
    _series: dict[tuple[str, str], dict[str, deque[tuple[float, float]]]] = field(
        default_factory=dict
    )
    _reads: dict[tuple[str, str], _RunReads] = field(default_factory=dict)
    passes: int = 0
    errors: int = 0
    loop: LoopCounts = field(default_factory=LoopCounts)

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
        alerts, remediation = cfg.alerts, cfg.remediation
        if alerts.alertmanager_url:
            notifiers.append(AlertmanagerNotifier(alerts.alertmanager_url))
        if alerts.webhook_url:
            notifiers.append(WebhookNotifier(alerts.webhook_url))
        if alerts.slack_url:
            notifiers.append(SlackNotifier(alerts.slack_url))
        policy, projects = DEFAULT_POLICY, {}
        if alerts.policy:
            try:
                with open(alerts.policy) as fh:
                    doc = yaml.safe_load(fh) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise ConfigError(f"cannot read alert policy {alerts.policy}: {exc}") from exc
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
                mode=remediation.mode,
                restart_cost_s=remediation.restart_cost_s,
                persist_s=remediation.straggler_persist_s,
            ),
            build_actuators(remediation.actuators),
            hang_rule=HangRule(cfg.analyzer.hang_k, cfg.analyzer.hang_floor_s),
            readable_roots=cfg.readable_roots,
        )
        return cls(
            telemetry,
            metadata,
            findings,
            AlertStore(metadata, access, alerts.public_url),
            Delivery(notifiers),
            metrics,
            policy,
            projects,
            remediation=controller,
            captures=Captures(metadata, cfg.analyzer),
            regressions=Regressions(metadata, telemetry, cfg.analyzer.regression_tolerance),
            config=cfg.monitor,
            analyzer=cfg.analyzer,
        )

    def close(self) -> None:
        self.delivery.close()

    def take_over(self) -> None:
        """This server now leads: the goodput windows it kept when it led before are stale."""
        self._goodput.clear()
        self._series.clear()
        self._reads.clear()
        if self.remediation is not None:
            self.remediation.take_over()

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
            analyze_once(self.telemetry, self.findings, now, self.analyzer, self.loop)
        except Exception:
            self.errors += 1
            log.exception("analysis pass failed")
        runs = self._active_runs(now)
        active = {(r.tenant, r.run_id) for r in runs}
        for kept in (self._goodput, self._series, self._judged, self._reads):  # quiet runs
            for key in [k for k in kept if k not in active]:
                del kept[key]
        snapshot: list[RunMetrics] = []
        by_tenant: dict[str, tuple[list[str], list[Any]]] = {}
        found: list[tuple[str, str, list[FindingRow]]] = []
        for run in runs:
            try:
                signals, metrics = self._signals(run, now)
            except Exception:
                self.errors += 1
                log.exception("monitoring run %s failed", run.run_id)
                continue
            snapshot.append(metrics)
            found.append((run.tenant, run.run_id, signals.findings))
            self._regression(run, now)
            policy = self.policy_for(run.project, dict(run.config or {}))
            ids, cands = by_tenant.setdefault(run.tenant, ([], []))
            ids.append(run.run_id)
            cands.extend(evaluate(policy, signals))
        eval_rules = self._evaluation_rules()
        for tenant, (ids, cands) in by_tenant.items():
            try:
                self.delivery.submit(self.alerts.apply(tenant, ids, cands, now, exclude=eval_rules))
            except Exception:
                self.errors += 1
                log.exception("alert reconciliation failed for tenant %s", tenant)
        try:
            self._evaluation_alerts(now, eval_rules)
        except Exception:
            self.errors += 1
            log.exception("evaluation alerts failed")
        try:
            if self.remediation is not None:
                self.remediation.tick(runs, now)
        except Exception:
            self.errors += 1
            log.exception("remediation pass failed")
        try:
            if self.captures is not None:
                self.captures.plan(found, now)
        except Exception:
            self.errors += 1
            log.exception("trace capture pass failed")
        self._export(snapshot)
        self._preserve(now)
        self.passes += 1

    def _regression(self, run: Run, now: float) -> None:
        """The run against its workload's fleet baseline, at most every ``regression_every_s``
        a run (every 5 s while it has too few steps to judge)."""
        key = (run.tenant, run.run_id)
        every = self.analyzer.regression_every_s
        if self.regressions is None or now - self._judged.get(key, 0.0) < every:
            return
        self._judged[key] = now
        try:
            info = self.metadata.get_run(Scope(run.tenant, "viewer", actor="monitor"), run.run_id)
            if not self.regressions.raise_findings(self.findings, run.tenant, info):
                self._judged[key] = now - every + min(every, _REGRESSION_RETRY_S)  # too few steps
            elif info.status not in LIVE:
                self._judged[key] = math.inf  # judged once ended: nothing will change it
        except Exception:
            self.errors += 1
            log.exception("the regression check of run %s failed", run.run_id)

    def _evaluation_rules(self) -> set[str]:
        rules = [self.policy, *(self.policy.merged(o) for o in self.project_overrides.values())]
        return {r.name for p in rules for r in p.rules if r.signal == "evaluation"}

    def _evaluation_alerts(self, now: float, names: set[str]) -> None:
        """Alerts from what each model version's latest judged evaluation regressed."""
        latest: dict[tuple[str, str, str], Evaluation] = {}
        with self.metadata.session() as s:
            q = all_tenants(
                select(Evaluation)
                .where(
                    Evaluation.state == "COMPLETED",
                    Evaluation.model_id != "",
                    Evaluation.regressions.is_not(None),
                )
                .order_by(Evaluation.id.desc())
                .limit(self.config.max_runs * 10)
            )
            for ev in s.scalars(q).all():  # the newest first: the first of a version is its latest
                latest.setdefault((ev.tenant, ev.model_id, ev.model_version), ev)
            tenants = {
                t
                for (t,) in s.execute(
                    all_tenants(
                        select(Evaluation.tenant)
                        .where(Evaluation.regressions.is_not(None))
                        .distinct()
                    )
                )
            }
        by_tenant: dict[str, list[Any]] = {t: [] for t in tenants}
        for (tenant, _, _), ev in latest.items():
            sig = EvaluationSignals(
                tenant=tenant,
                project=ev.project,
                run_id=ev.run_id,
                model_id=ev.model_id,
                model_version=ev.model_version,
                evaluation_id=ev.evaluation_id,
                completed_at=float(ev.completed_at or ev.created_at),
                regressions=list(ev.regressions or []),
            )
            by_tenant[tenant].extend(evaluate_evaluation(self.policy_for(ev.project, {}), sig))
        for tenant, cands in by_tenant.items():
            self.delivery.submit(self.alerts.apply(tenant, None, cands, now, names=names))

    def _active_runs(self, now: float) -> list[Run]:
        return self.metadata.active_runs(now - self.config.active_s, self.config.max_runs)

    def _read(self, run: Run, scope: Scope, reader: TenantReader) -> _RunReads:
        """The run's telemetry reads, again only when data of it arrived since the last."""
        key = (run.tenant, run.run_id)
        kept = self._reads.get(key)
        if kept is not None and kept.arrivals == run.arrivals:
            return kept
        # ``run`` was loaded before these reads: data arriving meanwhile is read next pass.
        kept = _RunReads(
            arrivals=run.arrivals,
            summary=RunQueries(self.telemetry, scope).summary(run.run_id, window=50),
            last_end=RunTelemetryQueries(reader).last_step_end(run.run_id) or None,
            spread=PortalQueries(self.telemetry, scope).recent_spread(run.run_id, window=50),
        )
        self._reads[key] = kept
        return kept

    def _signals(self, run: Run, now: float) -> tuple[RunSignals, RunMetrics]:
        scope = Scope(tenant=run.tenant, role="viewer", actor="monitor")
        reader = TenantReader(self.telemetry, scope)
        read = self._read(run, scope, reader)
        summary, last_end = read.summary, read.last_end
        step_ms = summary.step_time_ms
        findings = self.findings.rows(scope, run.run_id)
        stops = RunTelemetryQueries(reader).events_of_kinds(run.run_id, _STOP_KINDS).to_pylist()
        drains = [
            (float(r["time"]), str(r["node_id"]))
            for r in stops
            if r["kind"] in ("drain", "maintenance")
        ]
        # A checkpoint is progress (the one hang rule counts it so), not a stop.
        progress = [float(r["time"]) for r in stops if r["kind"].startswith("checkpoint_")]
        stopped = [
            float(r["time"])
            for r in stops
            if r["kind"] != "restart" and not r["kind"].startswith("checkpoint_")
        ]
        status, _ = self.metadata.status_of(run, now)
        series = self._goodput_series(run, now, status)
        sampled = self._metric_series(run, now, status, reader, summary)
        open_findings: dict[str, int] = {}
        for f in findings:
            end = f.end_step
            if end is None or summary.step is None or summary.step - end <= RESOLVE_STEPS:
                open_findings[f.diagnosis] = open_findings.get(f.diagnosis, 0) + 1
        signals = RunSignals(
            tenant=run.tenant,
            run_id=run.run_id,
            project=run.project,
            now=now,
            status=status,
            last_step=int(summary.step or -1),
            last_step_end=last_end,
            step_time=step_ms / 1000.0 if step_ms else None,
            goodput=list(series),
            findings=findings,
            drains=drains,
            stopped_at=max(stopped) if stopped else None,
            progress_at=max(progress) if progress else None,
            metrics={k: list(v) for k, v in sampled.items()},
            clock=run.last_seen,  # the newest time the run's own records carry
        )
        logged_mfu = summary.scalars.get("mfu")
        spread = read.spread
        metrics = RunMetrics(
            tenant=run.tenant,
            project=run.project,
            run_id=run.run_id,
            goodput=series[-1][1] if series else None,
            # the on-call page's spread (it was exported, never filled)
            spread=spread.spread if spread else None,
            step_time_max=step_ms / 1000.0 if step_ms else None,
            step_time_median=(summary.mean_rank_step_time_ms or 0) / 1000.0 or None,
            tokens_per_s=summary.tokens_per_second,
            # a scalar the job logs as "mfu" wins; else the config's FLOPs over the window
            mfu=logged_mfu if logged_mfu is not None else summary_mfu(run.config or {}, summary)[0],
            last_step_age_s=(now - last_end) if last_end else None,
            findings=open_findings,
            **{k: v[-1][1] for k, v in sampled.items() if v and k in SAMPLED_METRICS},
        )
        return signals, metrics

    def _metric_series(
        self, run: Run, now: float, status: str, reader: TenantReader, summary: RunSummary
    ) -> dict[str, deque[tuple[float, float]]]:
        """The run's per-metric alert inputs over time, sampled like its goodput."""
        series = self._series.setdefault((run.tenant, run.run_id), {})
        if status not in LIVE:
            return series
        newest = max((d[-1][0] for d in series.values() if d), default=None)
        if newest is not None and now - newest < self.config.goodput_every_s:
            return series
        samples = metric_samples(reader, run.run_id, dict(run.config or {}), summary, now)
        for name, value in samples.items():
            if value is not None:
                series.setdefault(name, deque(maxlen=512)).append((now, value))
        return series

    def _goodput_series(self, run: Run, now: float, status: str) -> deque[tuple[float, float]]:
        key = (run.tenant, run.run_id)
        series = self._goodput.setdefault(key, deque(maxlen=512))
        if status not in LIVE:
            return series
        if series and now - series[-1][0] < self.config.goodput_every_s:
            return series
        w = goodput_window(
            self.telemetry,
            run.tenant,
            run.run_id,
            self.config.goodput_window_s,
            now,
            started=run.first_seen,
        )
        g = w.job_product
        if not math.isfinite(g):
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
        firing: dict[tuple[str, str, str], int] = {}
        faults: dict[tuple[str, str, str], int] = {}
        for tenant in {r.tenant for r in runs}:
            scope = Scope(tenant=tenant, role="viewer", actor="monitor")
            for a in self.alerts.list(scope, state="firing", limit=10_000):
                key = (tenant, a.alertname, a.severity)
                firing[key] = firing.get(key, 0) + 1
                node = a.labels.get("node")
                if node and a.alertname in ("FatalHardwareFault", "RecoverableHardwareFault"):
                    cls = "fatal" if a.severity == "page" else "recoverable"
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
