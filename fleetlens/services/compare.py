"""Comparison and infrastructure-lineage reads over one tenant's telemetry (chDB/ClickHouse).

Everything per step is aggregated in the engine (:mod:`fleetlens.store.compare_queries`); what
comes back is a row per run (speed, health) or per run, metric and tenth of the matched step
range (loss curves), so comparing twenty 100,000-step runs moves kilobytes.
"""

from __future__ import annotations

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
from ..store.metadata import MetadataStore
from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.scoped import scoped
from ..store.telemetry import TelemetryStore
from .contract import compared, run_contract
from .goodput import GoodputQueries, program_spec, window_mfu
from .scheduler import scheduling_factor

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

    def speed(self, runs: list[str]) -> dict[str, dict[str, Any]]:
        """Per run: steps, median/mean step time, tokens/s, rank spread, slow-step share and
        the productive share of wall-clock (last execution of each step over first start to
        last end)."""
        table = self.q.speed(runs)
        out = {}
        for r in table.to_pylist():
            out[str(r.pop("run_id"))] = {k: _clean(v) for k, v in r.items()}
        return out

    def matched_scalars(self, runs: list[str], names: list[str]) -> dict[str, Any]:
        """Scalars at the steps every run logged: per metric the matched range and, per run,
        the mean over each tenth of it (the last tenth is what the conclusion reads)."""
        table = self.q.matched_scalar_buckets(runs, names, BUCKETS)
        out: dict[str, Any] = {}
        for r in table.to_pylist():
            m = out.setdefault(
                r["metric"],
                {
                    "fromStep": r["x_lo"],
                    "toStep": r["x_hi"],
                    "matchedSteps": r["x_cnt"],
                    "buckets": {},
                },
            )
            b = m["buckets"].setdefault(
                r["bucket"], {"fromStep": r["x_from"], "toStep": r["x_to"], "values": {}}
            )
            b["fromStep"], b["toStep"] = (
                min(b["fromStep"], r["x_from"]),
                max(b["toStep"], r["x_to"]),
            )
            b["values"][r["run_id"]] = _clean(r["x_mean"])
        for m in out.values():
            m["buckets"] = [m["buckets"][k] for k in sorted(m["buckets"])]
            m["tail"] = m["buckets"][-1]["values"] if m["buckets"] else {}
        return out

    def health(self, runs: list[str]) -> dict[str, dict[str, Any]]:
        """Per run: fault and lifecycle events by kind, nodes named by them, nodes and GPUs used."""
        ev = self.q.events_by_kind(runs, list(FAULT_KINDS))
        pl = self.q.placement_counts(runs)
        out: dict[str, dict[str, Any]] = {
            r: {"faults": {}, "faultNodes": [], "nodes": 0, "gpus": 0} for r in runs
        }
        for r in ev.to_pylist():
            h = out[r["run_id"]]
            h["faults"][r["kind"]] = int(r["n"])
            h["faultNodes"] = sorted(set(h["faultNodes"]) | {n for n in r["nodes"] if n})
        for r in pl.to_pylist():
            out[r["run_id"]].update(nodes=int(r["n_nodes"]), gpus=int(r["n_gpus"]))
        return out

    def infrastructure(self, run_id: str) -> dict[str, Any]:
        """Run -> the nodes and GPUs it used -> their faults during the run; its slow episodes
        and how each job attempt ended."""
        span = self.speed([run_id]).get(run_id, {})
        used = self.q.gpus_used(run_id).to_pylist()
        nodes = sorted({r["node_id"] for r in used})
        t0, t1 = span.get("t_first"), span.get("t_last")
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
        xid: list[dict[str, Any]] = []
        if nodes and t0 is not None:
            per: dict[tuple[str, int], dict[str, Any]] = {}
            for r in self.q.xid_samples(nodes, float(t0), float(t1 or t0)).to_pylist():
                if here(r["node_id"], r["time"]):
                    first = {
                        "node_id": r["node_id"],
                        "gpu": r["gpu"],
                        "first": r["time"],
                        "max_xid": r["xid"],
                        "n": 0,
                    }
                    g = per.setdefault((r["node_id"], r["gpu"]), first)
                    g["max_xid"], g["n"] = max(g["max_xid"], r["xid"]), g["n"] + 1
            xid = [per[k] for k in sorted(per)]
        steps, durs = self.q.step_times(run_id)
        ends = [
            {
                "time": e["time"],
                "kind": e["kind"],
                "jobId": e["job_id"] or None,
                "message": e["message"],
                "attrs": e["attrs"],
            }
            for e in ev_rows
            if e["kind"] in ("failure", "preemption") and e["of_run"] == run_id
        ]
        return {
            "runId": run_id,
            "nodes": [
                {
                    "node": r["node_id"],
                    "gpu": r["gpu"],
                    "gpuUuid": r["uuid"] or None,
                    "rack": r["rk"] or None,
                    "jobs": sorted(r["jobs"]),
                }
                for r in used
            ],
            "faults": [
                {
                    "time": e["time"],
                    "kind": e["kind"],
                    "node": e["node_id"] or None,
                    "gpu": e["gpu"] if e["gpu"] >= 0 else None,
                    "step": e["step"],
                    "message": e["message"],
                    "sameRun": e["of_run"] == run_id,
                }
                for e in ev_rows
            ],
            "xidErrors": [
                {
                    "node": r["node_id"],
                    "gpu": r["gpu"],
                    "first": r["first"],
                    "maxXid": _clean(r["max_xid"]),
                    "samples": r["n"],
                }
                for r in xid
            ],
            "jobEnds": ends,
            "slowEpisodes": slow_episodes(steps, durs),
            "speed": span,
        }


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return v


def _figures(
    run_id: str,
    speed: dict[str, Any],
    health: dict[str, Any],
    quality: dict[str, Any],
    lineage: dict[str, Any],
    findings: dict[str, int],
) -> RunFigures:
    ds = lineage.get("dataset") or {}
    code = lineage.get("code") or {}
    faults = {k: v for k, v in health.get("faults", {}).items() if k in INFRA_FAULTS}
    return RunFigures(
        run_id=run_id,
        step_time_s=speed.get("median_step_s"),
        tokens_per_s=speed.get("tokens_per_s"),
        straggler_spread=speed.get("spread"),
        slow_step_share=speed.get("slow_share"),
        faults=faults,
        findings=findings,
        quality={m: v["tail"][run_id] for m, v in quality.items() if run_id in v["tail"]},
        dataset=f"{ds['name']}:{ds['version']}" if ds.get("name") else None,
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
) -> dict[str, dict[str, float | None]]:
    """Each run's goodput as its run page and ``GET /v1/runs/{id}/goodput`` have it (the same
    breakdown, program spec and scheduling factor), so that a comparison never disagrees with
    them; a run without steps has none."""
    q = GoodputQueries(telemetry, scope)
    out: dict[str, dict[str, float | None]] = {}
    for run, config in zip(runs, configs, strict=True):
        sched = scheduling_factor(telemetry, scope, run)["factor"]
        bd, f, _ = q.run_goodput(run, program_spec(config), scheduling=sched)
        if bd.retained_steps:
            out[run] = {"goodput": f.job_product, "runtimeGoodput": f.runtime}
    return out


def _mfu(config: dict[str, Any], speed: dict[str, Any]) -> float | None:
    return window_mfu(
        program_spec(config),
        speed.get("tokens_per_s"),
        speed.get("median_step_s"),
        speed.get("ranks"),
    )


def compare_runs(
    telemetry: TelemetryStore, metadata: MetadataStore, scope: Scope, runs: list[str]
) -> dict[str, Any]:
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
    diff = config_diff([ln["config"] for ln in lineages])
    store = FindingsStore(metadata)
    goodput = _goodput(telemetry, scope, runs, [ln["config"] or {} for ln in lineages])
    evaluations = evaluation_deltas(metadata, scope, runs)
    contracts = [
        run_contract(metadata, telemetry, scope, metadata.get_run(scope, r))
        or Contract({}, {}, None, None)  # the store could not say: nothing to tell apart
        for r in runs
    ]
    against = compared(contracts)
    failures = _evaluation_failures(metadata, scope, runs, evaluations)
    figures = [
        _figures(r, speed.get(r, {}), health[r], quality, ln, _infra_findings(store, scope, r))
        for r, ln in zip(runs, lineages, strict=True)
    ]
    for f in figures:
        f.goodput = goodput.get(f.run_id, {}).get("goodput")
        f.evaluation_failures = failures[f.run_id]
    side = []
    for r, ln, f in zip(runs, lineages, figures, strict=True):
        sp = speed.get(r, {})
        side.append(
            {
                "runId": r,
                "steps": sp.get("n_steps"),
                "lastStep": sp.get("last_step"),
                "stepTimeMedianSeconds": sp.get("median_step_s"),
                "tokensPerSecond": sp.get("tokens_per_s"),
                "mfu": _mfu(ln["config"], sp),
                **goodput.get(r, {}),
                "productiveShare": sp.get("productive_share"),
                "stragglerSpread": sp.get("spread"),
                "slowStepShare": sp.get("slow_share"),
                "replayedSteps": sp.get("replayed_steps"),
                "health": {**health[r], "issues": f.infra_issues()},
                "dataset": f.dataset,
                "code": f.code,
            }
        )
    return {
        "runs": runs,
        "baseline": runs[0],
        "config": diff,
        "dataset": {
            "values": [f.dataset for f in figures],
            "changed": len({f.dataset for f in figures}) > 1,
        },
        "code": {
            "values": [f.code for f in figures],
            "changed": len({f.code for f in figures}) > 1,
        },
        "side": side,
        "matchedSteps": quality,
        "evaluations": evaluations,
        "contract": {
            "values": [c.text() for c in contracts],
            "differences": against,
            "changed": any(against),
        },
        "conclusions": [
            conclude(figures[0], f, config_diff([lineages[0]["config"], ln["config"]]), d)
            for f, ln, d in zip(figures[1:], lineages[1:], against, strict=True)
        ],
        "basis": {
            "stepTime": "median over steps of the slowest rank's duration (last execution)",
            "goodput": "the job's goodput (runtime x program) as the run page and "
            "/v1/runs/{run_id}/goodput have it; runtimeGoodput its runtime factor",
            "productiveShare": "sum of retained steps' durations over first start to last end",
            "matchedSteps": "mean of each tenth of the steps every run logged; the "
            "conclusion reads the last tenth",
            "evaluations": "each run's latest completed evaluation (by runId); deltas against "
            "the first run's, metric by metric (benchmark/metric, performance/latency...)",
            "contract": "the software each run's ranks reported and the topology it was "
            "placed on; differences against the first run's (seed 003 s9.3.1)",
        },
    }


def _evaluation_failures(
    metadata: MetadataStore, scope: Scope, runs: list[str], evaluations: dict[str, Any] | None
) -> dict[str, list[str]]:
    """What each run's latest evaluation failed: its regressions against the model's
    baseline (by kind: safety, benchmark, latency, cost) and the quality gates decided on it."""
    out: dict[str, list[str]] = {r: [] for r in runs}
    if evaluations is None:
        return out
    with metadata.session() as s:
        for r, ev in zip(runs, evaluations["byRun"], strict=True):
            if ev is None:
                continue
            for reg in ev.get("regressions") or []:
                out[r].append(f"{reg.get('kind', 'benchmark')} regression in {reg.get('metric')}")
            failed = s.scalars(
                scoped(select(GateDecision), scope).where(
                    GateDecision.candidate_evaluation == ev["evaluationId"],
                    GateDecision.passed.is_(False),
                )
            ).all()
            out[r] += [f"quality gate {d.decision_id} failed" for d in failed]
    return out


def evaluation_deltas(
    metadata: MetadataStore, scope: Scope, runs: list[str]
) -> dict[str, Any] | None:
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
            else {
                "runId": r,
                "evaluationId": ev.evaluation_id,
                "modelId": ev.model_id or None,
                "modelVersion": ev.model_version or None,
                "suite": f"{ev.suite.get('name')}@{ev.suite.get('version')}",
                "regressions": ev.regressions,
            }
            for r, ev in zip(runs, latest, strict=True)
        ]
    metrics: dict[str, Any] = {}
    for name in sorted({k for f in flat for k in f}):
        values = [f.get(name) for f in flat]
        base = values[0]
        metrics[name] = {
            "values": values,
            "deltas": [None if v is None or base is None else v - base for v in values],
        }
    return {"byRun": by_run, "metrics": metrics}
