"""Comparison and infrastructure-lineage reads over one tenant's telemetry (chDB/ClickHouse).

Everything per step is aggregated in the engine (:mod:`fleetlens.store.compare_queries`); what
comes back is a row per run (speed, health) or per run, metric and tenth of the matched step
range (loss curves), so comparing twenty 100,000-step runs moves kilobytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from sqlalchemy import select

from ..analysis.compare import (
    INFRA_FAULTS,
    QUALITY_METRICS,
    RunFigures,
    conclude,
    config_diff,
    slow_episodes,
)
from ..analysis.contract import Contract
from ..analysis.rootcause import owner_of
from ..errors import ConfigError
from ..evaluation.models import Evaluation, GateDecision
from ..store.compare_queries import ComparisonQueries
from ..store.detect_queries import DetectQueries
from ..store.findings import FindingsStore
from ..store.graph import GraphStore
from ..store.graph_types import RunLineage
from ..store.metadata import MetadataStore
from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.scoped import scoped
from ..store.telemetry import TelemetryStore
from .compare_types import (
    ChangedValues,
    CompareSide,
    Comparison,
    ContractDiff,
    EvaluationDeltas,
    InfraFault,
    InfraNode,
    Infrastructure,
    JobEnd,
    MatchedBucket,
    MatchedMetric,
    MetricDeltas,
    RunEvaluation,
    RunHealth,
    RunSpeed,
    XidError,
)
from .contract import compared, run_contract
from .goodput import GoodputQueries, program_spec, window_mfu
from .scheduler import run_scheduling_factor

__all__ = ["FAULT_KINDS", "CompareQueries", "compare_runs"]

FAULT_KINDS = (
    "hardware_fault", "hang", "failure", "restart", "preemption", "drain", "nan", "oom",
    "exception", "signal",
)  # fmt: skip
BUCKETS = 10


class CompareQueries:
    def __init__(self, telemetry: TelemetryStore, scope: Scope) -> None:
        self.t = telemetry
        self.q = ComparisonQueries(TenantReader(telemetry, scope))
        self.tenant = scope.tenant

    def speed(self, runs: list[str]) -> dict[str, RunSpeed]:
        """Per run: steps, median/mean step time, tokens/s, rank spread, slow-step share and
        the productive share of wall-clock (last execution of each step over first start to
        last end)."""
        table = self.q.speed(runs)
        out = {}
        for r in table.to_pylist():
            out[str(r["run_id"])] = RunSpeed(**{k: _clean(v) for k, v in r.items()})
        return out

    def matched_scalars(self, runs: list[str], names: list[str]) -> dict[str, MatchedMetric]:
        """Scalars at the steps every run logged: per metric the matched range and, per run,
        the mean over each tenth of it (the last tenth is what the conclusion reads)."""
        table = self.q.matched_scalar_buckets(runs, names, BUCKETS)
        ranges: dict[str, tuple[int, int, int]] = {}
        # metric -> bucket -> ([from step, to step], {run: mean})
        tenths: dict[str, dict[int, tuple[list[int], dict[str, float | None]]]] = {}
        for r in table.to_pylist():
            ranges.setdefault(r["metric"], (r["x_lo"], r["x_hi"], r["x_cnt"]))
            span, values = tenths.setdefault(r["metric"], {}).setdefault(
                r["bucket"], ([r["x_from"], r["x_to"]], {})
            )
            span[0], span[1] = min(span[0], r["x_from"]), max(span[1], r["x_to"])
            values[r["run_id"]] = _clean(r["x_mean"])
        out: dict[str, MatchedMetric] = {}
        for metric, (lo, hi, cnt) in ranges.items():
            per = tenths[metric]
            buckets = [MatchedBucket(per[k][0][0], per[k][0][1], per[k][1]) for k in sorted(per)]
            out[metric] = MatchedMetric(lo, hi, cnt, buckets, buckets[-1].values if buckets else {})
        return out

    def health(self, runs: list[str]) -> dict[str, RunHealth]:
        """Per run: fault and lifecycle events by kind, nodes named by them, nodes and GPUs used."""
        ev = self.q.events_by_kind(runs, list(FAULT_KINDS))
        pl = self.q.placement_counts(runs)
        faults: dict[str, dict[str, int]] = {r: {} for r in runs}
        fault_nodes: dict[str, set[str]] = {r: set() for r in runs}
        used = {r: (0, 0) for r in runs}
        for r in ev.to_pylist():
            faults[r["run_id"]][r["kind"]] = int(r["n"])
            fault_nodes[r["run_id"]] |= {n for n in r["nodes"] if n}
        for r in pl.to_pylist():
            used[r["run_id"]] = (int(r["n_nodes"]), int(r["n_gpus"]))
        return {
            r: RunHealth(faults[r], sorted(fault_nodes[r]), used[r][0], used[r][1]) for r in runs
        }

    def infrastructure(self, run_id: str) -> Infrastructure:
        """Run -> the nodes and GPUs it used -> their faults during the run; its slow episodes
        and how each job attempt ended."""
        span = self.speed([run_id]).get(run_id)
        used = self.q.gpus_used(run_id).to_pylist()
        nodes = sorted({r["node_id"] for r in used})
        t0 = span.t_first if span is not None else None
        t1 = span.t_last if span is not None else None
        ev_rows = self.q.events_of_run_or_nodes(
            run_id,
            list(FAULT_KINDS),
            nodes or [""],
            float(t0) if t0 is not None else 0.0,
            float(t1) if t1 is not None else 0.0,
        ).to_pylist()
        # Another run's faults count only on a node while this run was placed on it.
        placed = DetectQueries(self.t, self.tenant).placed(run_id) if nodes else {}

        def here(node: str, t: float) -> bool:
            return any(a <= t <= b for a, b in placed.get(node, []))

        ev_rows = [e for e in ev_rows if e["of_run"] == run_id or here(e["node_id"], e["time"])]
        xid: list[XidError] = []
        if nodes and t0 is not None:
            per: dict[tuple[str, int], tuple[float, Any, int]] = {}  # first, max XID, samples
            for r in self.q.xid_samples(nodes, float(t0), float(t1 or t0)).to_pylist():
                if here(r["node_id"], r["time"]):
                    key = (r["node_id"], r["gpu"])
                    first, top, n = per.get(key, (r["time"], r["xid"], 0))
                    per[key] = (first, max(top, r["xid"]), n + 1)
            xid = [
                XidError(k[0], k[1], per[k][0], _clean(per[k][1]), per[k][2]) for k in sorted(per)
            ]
        steps, durs = self.q.step_times(run_id)
        return Infrastructure(
            run_id=run_id,
            nodes=[
                InfraNode(
                    r["node_id"], r["gpu"], r["uuid"] or None, r["rk"] or None, sorted(r["jobs"])
                )
                for r in used
            ],
            faults=[
                InfraFault(
                    time=e["time"],
                    kind=e["kind"],
                    node=e["node_id"] or None,
                    gpu=e["gpu"] if e["gpu"] >= 0 else None,
                    step=e["step"],
                    message=e["message"],
                    same_run=e["of_run"] == run_id,
                )
                for e in ev_rows
            ],
            xid_errors=xid,
            job_ends=[
                JobEnd(e["time"], e["kind"], e["job_id"] or None, e["message"], e["attrs"])
                for e in ev_rows
                if e["kind"] in ("failure", "preemption") and e["of_run"] == run_id
            ],
            slow_episodes=slow_episodes(steps, durs),
            speed=span,
        )


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return v


def _figures(
    run_id: str,
    speed: RunSpeed | None,
    health: RunHealth,
    quality: dict[str, MatchedMetric],
    lineage: RunLineage,
    findings: dict[str, int],
) -> RunFigures:
    ds = lineage.dataset
    code = lineage.code
    faults = {k: v for k, v in health.faults.items() if k in INFRA_FAULTS}
    sp = speed or RunSpeed()
    return RunFigures(
        run_id=run_id,
        step_time_s=sp.median_step_s,
        tokens_per_s=sp.tokens_per_s,
        straggler_spread=sp.spread,
        slow_step_share=sp.slow_share,
        faults=faults,
        findings=findings,
        # a run's mean that was not finite is as good as none (conclude reads .get)
        quality={m: x for m, v in quality.items() if (x := v.tail.get(run_id)) is not None},
        dataset=f"{ds.name}:{ds.version}" if ds is not None and ds.name else None,
        code=str(code.get("commit") or "") or None,
    )


def _infra_findings(store: FindingsStore, scope: Scope, run_id: str) -> dict[str, int]:
    """The run's findings the fleet owns (GPUs, racks, stragglers, network, hosts, storage), by
    diagnosis; training-code, data-pipeline and scheduler findings are not the fleet's."""
    out: dict[str, int] = {}
    for f in store.rows(scope, run_id):
        if owner_of(f.diagnosis) in ("infrastructure", "network", "host", "storage"):
            out[f.diagnosis] = out.get(f.diagnosis, 0) + 1
    return out


def _goodput(
    telemetry: TelemetryStore, scope: Scope, runs: list[str], configs: list[dict[str, Any]]
) -> dict[str, tuple[float, float]]:
    """Each run's goodput and its runtime factor as its run page and
    ``GET /v1/runs/{id}/goodput`` have them (the same breakdown, program spec and scheduling
    factor), so that a comparison never disagrees with them; a run without steps has none."""
    q = GoodputQueries(telemetry, scope)
    out: dict[str, tuple[float, float]] = {}
    for run, config in zip(runs, configs, strict=True):
        sched = run_scheduling_factor(telemetry, scope, run).factor
        bd, f, _ = q.run_goodput(run, program_spec(config), scheduling=sched)
        if bd.retained_steps:
            out[run] = (f.job_product, f.runtime)
    return out


def _mfu(config: dict[str, Any], speed: RunSpeed) -> float | None:
    return window_mfu(program_spec(config), speed.tokens_per_s, speed.median_step_s, speed.ranks)


def compare_runs(
    telemetry: TelemetryStore, metadata: MetadataStore, scope: Scope, runs: list[str]
) -> Comparison:
    """Runs side by side, the first as the baseline (see docs/run_graph.md)."""
    if len(runs) < 2:
        raise ConfigError("compare needs at least two runs")
    if len(set(runs)) != len(runs):
        raise ConfigError(f"a run is named twice in {runs}")
    graph = GraphStore(metadata)
    lineages = [graph.run_lineage(scope, r) for r in runs]  # NotFound for another tenant's run
    q = CompareQueries(telemetry, scope)
    speed = q.speed(runs)
    health = q.health(runs)
    names = [*QUALITY_METRICS, "lr", "grad_norm"]
    quality = q.matched_scalars(runs, names)
    diff = config_diff([ln.config for ln in lineages])
    store = FindingsStore(metadata)
    goodput = _goodput(telemetry, scope, runs, [ln.config for ln in lineages])
    evaluations = evaluation_deltas(metadata, scope, runs)
    contracts = [
        run_contract(metadata, telemetry, scope, metadata.get_run(scope, r))
        or Contract({}, {}, None, None)  # the store could not say: nothing to tell apart
        for r in runs
    ]
    against = compared(contracts)
    failures = _evaluation_failures(metadata, scope, runs, evaluations)
    figures = [
        _figures(r, speed.get(r), health[r], quality, ln, _infra_findings(store, scope, r))
        for r, ln in zip(runs, lineages, strict=True)
    ]
    for f in figures:
        f.goodput = goodput[f.run_id][0] if f.run_id in goodput else None
        f.evaluation_failures = failures[f.run_id]
    side = []
    for r, ln, f in zip(runs, lineages, figures, strict=True):
        sp = speed.get(r) or RunSpeed()
        g = goodput.get(r)
        side.append(
            CompareSide(
                run_id=r,
                steps=sp.n_steps,
                last_step=sp.last_step,
                step_time_median_seconds=sp.median_step_s,
                tokens_per_second=sp.tokens_per_s,
                mfu=_mfu(ln.config, sp),
                goodput=g[0] if g is not None else None,
                runtime_goodput=g[1] if g is not None else None,
                productive_share=sp.productive_share,
                straggler_spread=sp.spread,
                slow_step_share=sp.slow_share,
                replayed_steps=sp.replayed_steps,
                health=dataclasses.replace(health[r], issues=f.infra_issues()),
                dataset=f.dataset,
                code=f.code,
            )
        )
    return Comparison(
        runs=runs,
        baseline=runs[0],
        config=diff,
        dataset=ChangedValues([f.dataset for f in figures], len({f.dataset for f in figures}) > 1),
        code=ChangedValues([f.code for f in figures], len({f.code for f in figures}) > 1),
        side=side,
        matched_steps=quality,
        evaluations=evaluations,
        contract=ContractDiff([c.text() for c in contracts], against, any(against)),
        conclusions=[
            conclude(figures[0], f, config_diff([lineages[0].config, ln.config]), d)
            for f, ln, d in zip(figures[1:], lineages[1:], against, strict=True)
        ],
    )


def _evaluation_failures(
    metadata: MetadataStore, scope: Scope, runs: list[str], evaluations: EvaluationDeltas | None
) -> dict[str, list[str]]:
    """What each run's latest evaluation failed: its regressions against the model's
    baseline (by kind: safety, benchmark, latency, cost) and the quality gates decided on it."""
    out: dict[str, list[str]] = {r: [] for r in runs}
    if evaluations is None:
        return out
    with metadata.session() as s:
        for r, ev in zip(runs, evaluations.by_run, strict=True):
            if ev is None:
                continue
            for reg in ev.regressions or []:
                out[r].append(f"{reg.get('kind', 'benchmark')} regression in {reg.get('metric')}")
            failed = s.scalars(
                scoped(select(GateDecision), scope).where(
                    GateDecision.candidate_evaluation == ev.evaluation_id,
                    GateDecision.passed.is_(False),
                )
            ).all()
            out[r] += [f"quality gate {d.decision_id} failed" for d in failed]
    return out


def evaluation_deltas(
    metadata: MetadataStore, scope: Scope, runs: list[str]
) -> EvaluationDeltas | None:
    """Each run's latest completed evaluation, and every metric's change against the first
    run's (None when no run has one)."""
    latest: list[Evaluation | None] = []
    with metadata.session() as s:
        for r in runs:
            q = scoped(select(Evaluation), scope, within="project").where(
                Evaluation.run_id == r, Evaluation.state == "COMPLETED"
            )
            latest.append(s.scalars(q.order_by(Evaluation.id.desc())).first())
        if not any(latest):
            return None
        flat = [
            {
                f"{b}/{k}": float(v["mean"])
                for b, ms in (ev.metrics or {}).items()
                for k, v in ms.items()  # type: ignore[attr-defined]
            }
            if ev is not None
            else {}
            for ev in latest
        ]
        by_run = [
            None
            if ev is None
            else RunEvaluation(
                run_id=r,
                evaluation_id=ev.evaluation_id,
                model_id=ev.model_id or None,
                model_version=ev.model_version or None,
                suite=f"{ev.suite.get('name')}@{ev.suite.get('version')}",
                regressions=ev.regressions,
            )
            for r, ev in zip(runs, latest, strict=True)
        ]
    metrics: dict[str, MetricDeltas] = {}
    for name in sorted({k for f in flat for k in f}):
        values = [f.get(name) for f in flat]
        base = values[0]
        metrics[name] = MetricDeltas(
            values, [None if v is None or base is None else v - base for v in values]
        )
    return EvaluationDeltas(by_run, metrics)
