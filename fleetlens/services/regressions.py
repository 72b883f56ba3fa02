"""A run against its workload's fleet baseline (:mod:`fleetlens.analysis.regression`): its
figures and its baseline's read from the stores, and the findings a worse run raises.

The baseline runs are the tenant's most recently active :data:`MAX_RUNS` runs of the same
workload (any project: a workload is the fleet's, not a team's). A run's figures are read once
it has :data:`MIN_STEPS` steps in its newest attempt, and kept while the run has no new data
(:class:`Regressions` keeps them between the monitor's passes).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from ..analysis.contract import software
from ..analysis.regression import CONFIG_SOFTWARE_KEYS, RunFigures, Verdict, judge, workload_key
from ..analysis.rootcause import Diagnosis
from ..store.compare_queries import ComparisonQueries
from ..store.detect_queries import DetectQueries
from ..store.findings import FindingsStore
from ..store.metadata import MetadataStore, RunInfo
from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore

__all__ = ["MAX_RUNS", "MIN_STEPS", "Regressions", "RunRegression"]

log = logging.getLogger("fleetlens.regressions")

MAX_RUNS = 200
"""The tenant's most recently active runs searched for a workload's baseline."""
MIN_STEPS = 30
"""Steps a run's newest attempt needs before its step time is a figure."""
_DIAGNOSES = {"program": "program_regression", "startup": "startup_regression"}
_WHAT = {"program": "median step time", "startup": "startup (job start to first step)"}


@dataclass
class RunRegression:
    """A run's figures, its workload, and each tier's verdict against the baseline."""

    run: RunFigures | None
    workload: str | None
    verdicts: list[Verdict] = field(default_factory=list)


@dataclass
class Regressions:
    """Figures of runs read from the stores, kept per (tenant, run) while unchanged."""

    metadata: MetadataStore
    telemetry: TelemetryStore
    tolerance: float = 0.1
    _kept: dict[tuple[str, str], tuple[float, RunFigures | None]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, scope: Scope, info: RunInfo) -> RunRegression:
        """``info`` (a run the caller may see) against the baseline of its workload."""
        key = workload_key(info.config or {}, info.world_size)
        if key is None:
            return RunRegression(None, None)
        peers = [
            r
            for r in self.metadata.list_runs(Scope(scope.tenant, "viewer"), None, MAX_RUNS, 0)
            if r.run_id != info.run_id and workload_key(r.config or {}, r.world_size) == key
        ]
        figures = self._figures(scope.tenant, [info, *peers])
        mine = figures.get(info.run_id)
        if mine is None:
            return RunRegression(None, key)
        others = [f for r, f in figures.items() if r != info.run_id]
        return RunRegression(mine, key, judge(mine, others, self.tolerance))

    def raise_findings(self, findings: FindingsStore, tenant: str, info: RunInfo) -> bool:
        """Store the run's regression findings; False while it has no figures to judge."""
        got = self.of(Scope(tenant=tenant, role="viewer", actor="monitor"), info)
        if got.run is None:
            return False
        found = [_diagnosis(v, got.run) for v in got.verdicts if v.worse]
        if found:
            findings.upsert(tenant, info.run_id, found)
        return True

    def _figures(self, tenant: str, infos: list[RunInfo]) -> dict[str, RunFigures]:
        out: dict[str, RunFigures] = {}
        todo = []
        with self._lock:
            for i in infos:
                got = self._kept.get((tenant, i.run_id))
                if got is not None and got[0] == i.last_seen:
                    if got[1] is not None:
                        out[i.run_id] = got[1]
                else:
                    todo.append(i)
        if todo:
            read = _read(self.telemetry, tenant, todo)
            with self._lock:
                if len(self._kept) > 10 * MAX_RUNS:
                    self._kept.clear()
                for i in todo:
                    self._kept[(tenant, i.run_id)] = (i.last_seen, read.get(i.run_id))
            out.update({r: f for r, f in read.items() if f is not None})
        return out


def _read(telemetry: TelemetryStore, tenant: str, infos: list[RunInfo]) -> dict[str, RunFigures]:
    """The figures of runs with :data:`MIN_STEPS` steps in their newest attempt."""
    scope = Scope(tenant=tenant, role="viewer", actor="monitor")
    speed = {
        r["run_id"]: r
        for r in ComparisonQueries(TenantReader(telemetry, scope))
        .speed([i.run_id for i in infos])
        .to_pylist()
    }
    q = DetectQueries(telemetry, tenant)
    out = {}
    for info in infos:
        s = speed.get(info.run_id)
        if s is None:
            continue
        jobs = q.jobs(info.run_id)
        if not jobs or jobs[-1].last_step - jobs[-1].first_step + 1 < MIN_STEPS:
            continue
        newest = jobs[-1]
        started, envs = q.job_start(info.run_id, newest.job_id)
        sw, _ = software(envs)
        cfg = info.config or {}
        sw.update({k: str(cfg[k]) for k in CONFIG_SOFTWARE_KEYS if k in cfg})
        out[info.run_id] = RunFigures(
            run_id=info.run_id,
            t_first=float(s["t_first"]),
            software=sw,
            step_s=float(s["median_step_s"]) if s["median_step_s"] else None,
            startup_s=max(0.0, newest.start - started) if started is not None else None,
            steps=int(s["n_steps"]),
            from_step=newest.first_step,
        )
    return out


def _diagnosis(v: Verdict, run: RunFigures) -> Diagnosis:
    change = f"; coincides with {', '.join(v.changes)}" if v.changes else ""
    summary = (
        f"{_WHAT[v.tier]} {v.value:.3g} s against {v.baseline:.3g} s, the median of "
        f"{len(v.runs)} earlier run(s) of this workload ({v.ratio:.2f}x){change}"
    )
    return Diagnosis(
        key=f"regression:{v.tier}",
        diagnosis=_DIAGNOSES[v.tier],
        kind="regression",
        confidence=min(1.0, 0.5 + 0.5 * (v.value - v.bound) / max(v.bound, 1e-9)),
        summary=summary,
        step=run.from_step,
        start_step=run.from_step,
        end_step=-1,
        evidence=[_evidence(v)],
    )


def _evidence(v: Verdict) -> dict[str, Any]:
    return {
        "signal": "regression",
        "metric": _WHAT[v.tier],
        "value": v.value,
        "baseline": v.baseline,
        "threshold": v.bound,
        "baselineRuns": v.runs,
        "baselineSoftware": v.software,
        "changes": v.changes,
    }
