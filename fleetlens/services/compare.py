"""Comparison and infrastructure-lineage reads over one tenant's telemetry (chDB/ClickHouse).

Everything per step is aggregated in SQL from the ``steps_by_step`` rollup and the scalars
table; what comes back is a row per run (speed, health) or per run, metric and tenth of the
matched step range (loss curves), so comparing twenty 100,000-step runs moves kilobytes.
Aliases differ from the column names used inside aggregates (ClickHouse resolves an alias that
shadows a column inside another aggregate to the alias).
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
from ..analysis.rootcause import owner_of
from ..errors import ConfigError
from ..evaluation.models import Evaluation, GateDecision
from ..store.detect_queries import DetectQueries
from ..store.findings import FindingsStore
from ..store.graph import GraphStore
from ..store.metadata import MetadataStore
from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.scoped import scoped
from ..store.telemetry import TelemetryStore
from .goodput import GoodputQueries, program_spec, window_mfu
from .scheduler import scheduling_factor

__all__ = ["FAULT_KINDS", "CompareQueries", "compare_runs"]

FAULT_KINDS = (
    "hardware_fault", "hang", "failure", "restart", "preemption", "drain", "nan", "oom",
    "exception", "signal",
)  # fmt: skip
BUCKETS = 10


_PER_STEP = (
    # one row per (run, step): its last execution's duration, tokens and rank spread
    "SELECT run_id, step, argMax(x_dur, x_start) AS s_dur, argMax(x_tok, x_start) AS s_tok,"
    " argMax(x_spread, x_start) AS s_spread, argMax(x_ranks, x_start) AS s_ranks,"
    " min(x_start) AS s_start, max(x_end) AS s_end, count() AS s_exec FROM ("
    "  SELECT run_id, step, job_id, max(max_duration) AS x_dur, sum(tokens) AS x_tok,"
    "  if(sum(sum_compute) > 0, max(max_compute) * sum(ranks) / sum(sum_compute) - 1, nan)"
    "  AS x_spread, sum(ranks) AS x_ranks, min(start) AS x_start, max(`end`) AS x_end"
    "  FROM {db}.steps_by_step WHERE tenant = {tenant:String} AND run_id IN {runs:Array(String)}"
    "  GROUP BY run_id, step, job_id"
    ") GROUP BY run_id, step"
)


class CompareQueries:
    def __init__(self, telemetry: TelemetryStore, scope: Scope) -> None:
        self.t = telemetry
        self.db = telemetry.database
        self.r = TenantReader(telemetry, scope)
        self.tenant = scope.tenant

    def speed(self, runs: list[str]) -> dict[str, dict[str, Any]]:
        """Per run: steps, median/mean step time, tokens/s, rank spread, slow-step share and
        the productive share of wall-clock (last execution of each step over first start to
        last end)."""
        table = self.r.table(
            f"WITH per AS ({_PER_STEP}), med AS (SELECT run_id, median(s_dur) AS m_dur FROM per"
            " GROUP BY run_id) SELECT per.run_id AS run_id, count() AS n_steps,"
            " max(per.step) AS last_step, any(med.m_dur) AS median_step_s,"
            " avg(per.s_dur) AS mean_step_s, sum(per.s_tok) / sum(per.s_dur) AS tokens_per_s,"
            " avgIf(per.s_spread, isFinite(per.s_spread)) AS spread, max(per.s_ranks) AS ranks,"
            " countIf(per.s_dur > 2 * med.m_dur) / count() AS slow_share,"
            " sum(per.s_dur) / (max(per.s_end) - min(per.s_start)) AS productive_share,"
            " sum(per.s_exec) - count() AS replayed_steps,"
            " min(per.s_start) AS t_first, max(per.s_end) AS t_last"
            " FROM per INNER JOIN med ON per.run_id = med.run_id GROUP BY per.run_id",
            runs=runs,
        )
        out = {}
        for r in table.to_pylist():
            out[str(r.pop("run_id"))] = {k: _clean(v) for k, v in r.items()}
        return out

    def matched_scalars(self, runs: list[str], names: list[str]) -> dict[str, Any]:
        """Scalars at the steps every run logged: per metric the matched range and, per run,
        the mean over each tenth of it (the last tenth is what the conclusion reads)."""
        # One pass with window functions: a CTE used three times would be computed three times.
        table = self.r.table(
            "SELECT run_id, name AS metric, bucket, avg(v) AS x_mean, min(step) AS x_from,"
            " max(step) AS x_to, any(lo) AS x_lo, any(hi) AS x_hi, any(cnt) AS x_cnt FROM ("
            f" SELECT run_id, name, step, v, lo, hi, cnt, intDiv((step - lo) * {BUCKETS},"
            " (hi - lo + 1)) AS bucket FROM ("
            "  SELECT run_id, name, step, v, min(step) OVER (PARTITION BY name) AS lo,"
            "  max(step) OVER (PARTITION BY name) AS hi,"
            "  intDiv(count() OVER (PARTITION BY name), {n:UInt32}) AS cnt FROM ("
            "   SELECT run_id, name, step, v, count() OVER (PARTITION BY name, step) AS nruns"
            "   FROM (SELECT run_id, name, step, avg(value) AS v FROM {db}.scalars"
            "    WHERE tenant = {tenant:String} AND run_id IN {runs:Array(String)}"
            "    AND name IN {names:Array(String)} AND isFinite(value)"
            "    GROUP BY run_id, name, step)"
            "  ) WHERE nruns = {n:UInt32}))"
            " GROUP BY run_id, metric, bucket ORDER BY metric, bucket, run_id",
            runs=runs,
            names=names,
            n=len(runs),
        )
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
        ev = self.r.table(
            "SELECT run_id, kind, count() AS n, groupUniqArray(node_id) AS nodes FROM {db}.events"
            " WHERE tenant = {tenant:String} AND run_id IN {runs:Array(String)}"
            " AND kind IN {kinds:Array(String)} GROUP BY run_id, kind",
            runs=runs,
            kinds=list(FAULT_KINDS),
        )
        pl = self.r.table(
            "SELECT run_id, uniqExact(node_id) AS n_nodes, uniqExact(node_id, gpu) AS n_gpus"
            " FROM {db}.placement WHERE tenant = {tenant:String} AND run_id IN {runs:Array(String)}"
            " GROUP BY run_id",
            runs=runs,
        )
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

    def step_times(self, run_id: str) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        t = self.r.table(
            f"SELECT step, s_dur FROM ({_PER_STEP}) ORDER BY step",
            runs=[run_id],
        )
        if t.num_rows == 0:
            return np.zeros(0, np.int64), np.zeros(0)
        return (
            t.column("step").to_numpy().astype(np.int64),
            t.column("s_dur").to_numpy(zero_copy_only=False).astype(np.float64),
        )

    def infrastructure(self, run_id: str) -> dict[str, Any]:
        """Run -> the nodes and GPUs it used -> their faults during the run; its slow episodes
        and how each job attempt ended."""
        span = self.speed([run_id]).get(run_id, {})
        used = self.r.table(
            "SELECT node_id, gpu, any(gpu_uuid) AS uuid, any(rack) AS rk, groupUniqArray(job_id)"
            " AS jobs, min(rank) AS first_rank FROM {db}.placement WHERE tenant = {tenant:String}"
            " AND run_id = {run:String} GROUP BY node_id, gpu ORDER BY node_id, gpu",
            run=run_id,
        ).to_pylist()
        nodes = sorted({r["node_id"] for r in used})
        t0, t1 = span.get("t_first"), span.get("t_last")
        ev_rows = self.r.table(
            "SELECT time, kind, run_id AS of_run, job_id, step, node_id, gpu, message, attrs"
            " FROM {db}.events WHERE tenant = {tenant:String} AND kind IN {kinds:Array(String)}"
            " AND (run_id = {run:String} OR (node_id IN {nodes:Array(String)}"
            " AND time BETWEEN {t0:Float64} AND {t1:Float64})) ORDER BY time",
            run=run_id,
            kinds=list(FAULT_KINDS),
            nodes=nodes or [""],
            t0=float(t0) if t0 is not None else 0.0,
            t1=float(t1) if t1 is not None else 0.0,
        ).to_pylist()
        # Another run's faults count only on a node while this run was placed on it.
        placed = DetectQueries(self.t, self.tenant).placed(run_id) if nodes else {}

        def here(node: str, t: float) -> bool:
            return any(a <= t <= b for a, b in placed.get(node, []))

        ev_rows = [e for e in ev_rows if e["of_run"] == run_id or here(e["node_id"], e["time"])]
        xid: list[dict[str, Any]] = []
        if nodes and t0 is not None:
            per: dict[tuple[str, int], dict[str, Any]] = {}
            for r in self.r.table(
                "SELECT node_id, gpu, time, xid FROM {db}.gpu_samples WHERE tenant = "
                "{tenant:String} AND node_id IN {nodes:Array(String)} AND time BETWEEN "
                "{t0:Float64} AND {t1:Float64} AND xid > 0 ORDER BY time LIMIT 100000",
                nodes=nodes,
                t0=float(t0),
                t1=float(t1 or t0),
            ).to_pylist():
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
        steps, durs = self.step_times(run_id)
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
        "conclusions": [
            conclude(figures[0], f, config_diff([lineages[0]["config"], ln["config"]]))
            for f, ln in zip(figures[1:], lineages[1:], strict=True)
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
