"""A run against its workload's fleet baseline (:mod:`fleetlens.analysis.regression`): its
figures and its baseline's read from the stores, and the findings a worse run raises.

The baseline runs are the run's project's most recently active :data:`MAX_RUNS` runs of the
same workload that started before it (a project's token sees no other project's runs, and
neither do its findings). A run's figures are read once it has :data:`MIN_STEPS` steps in its
newest attempt; they are kept while the run has no new data, and a baseline run still taking
data is read again at most every :data:`PEER_REREAD_S` (:class:`Regressions` keeps them
between the monitor's passes).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ..analysis.contract import software
from ..analysis.evidence import Evidence
from ..analysis.regression import (
    CONFIG_SOFTWARE_KEYS,
    TIERS,
    RunFigures,
    Verdict,
    allocation,
    architecture_key,
    judge,
    workload_key,
)
from ..analysis.rootcause import Diagnosis
from ..analysis.timeline import Event, save_pauses
from ..lifecycle import LIVE
from ..store.compare_queries import ComparisonQueries
from ..store.detect_queries import DetectQueries
from ..store.findings import FindingsStore
from ..store.metadata import MetadataStore, RunBrief, RunInfo
from ..store.reader import TenantReader
from ..store.sched_queries import SchedQueries
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore
from .goodput import GoodputQueries, program_spec
from .scheduler import allocation_records

__all__ = ["MAX_RUNS", "MIN_STEPS", "PEER_REREAD_S", "Regressions", "RunRegression"]

log = logging.getLogger("fleetlens.regressions")

MAX_RUNS = 200
"""The project's most recently active runs searched for a workload's baseline."""
MIN_STEPS = 30
"""Steps a run's newest attempt needs before its step time is a figure."""
PEER_REREAD_S = 300.0
"""A baseline run still taking data is read again at most this often."""
DIAGNOSES = {tier: f"{tier}_regression" for tier in TIERS}
"""The finding each tier raises when the run is worse than its baseline."""
_OF = {
    "program": "earlier run(s) of this workload",
    "mfu": "earlier run(s) of this architecture at a like scale",
    "token": "earlier run(s) of this architecture at a like scale",
    "scaling": "run(s) at this size on the software it replaced (over its smallest runs)",
    "startup": "earlier fresh start(s) of this workload",
    "recovery": "earlier run(s) of this workload that restarted",
    "checkpoint": "earlier run(s) of this workload that committed checkpoints",
    "allocation": "earlier allocation(s) of its pool of a like size",
}


def _said(tier: str, value: float) -> str:
    unit = TIERS[tier].unit
    if tier == "mfu":
        return f"{value:.1%}"
    return f"{value:.3g} {unit}" if unit else f"{value:.3g}"


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
    # (tenant, run) -> (its last_seen when read, when read, its figures or None)
    _kept: dict[tuple[str, str], tuple[float, float, RunFigures | None]] = field(
        default_factory=dict
    )
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, scope: Scope, info: RunInfo) -> RunRegression:
        """``info`` (a run the caller may see) against the baselines of its workload, its
        architecture and its pool."""
        config = info.config or {}
        key, arch = workload_key(config, info.world_size), architecture_key(config)
        if key is None:
            return RunRegression(None, None)
        me = RunBrief(
            info.run_id,
            info.project,
            config,
            info.world_size,
            info.first_seen,
            info.last_seen,
        )
        mine = self._figures(scope.tenant, [me], 0.0).get(info.run_id)
        if mine is None:  # too few steps yet: the baseline is not read
            return RunRegression(None, key)
        peers = [
            r
            for r in self.metadata.run_briefs(Scope(scope.tenant, "viewer"), info.project, MAX_RUNS)
            if r.run_id != info.run_id
            and r.first_seen <= info.first_seen
            and architecture_key(r.config) == arch
        ]
        others = list(self._figures(scope.tenant, peers, PEER_REREAD_S).values())
        verdicts = judge(mine, others, self.tolerance)
        waits = self._pool_waits(scope.tenant, mine)
        alloc = allocation(mine, waits, self.tolerance)
        return RunRegression(mine, key, verdicts + ([alloc] if alloc is not None else []))

    def _pool_waits(self, tenant: str, run: RunFigures) -> list[tuple[str, float]]:
        """The pool's newest allocations of a like size submitted before the run's."""
        if run.pool is None or run.alloc_submit is None:
            return []
        reader = TenantReader(self.telemetry, Scope(tenant=tenant, role="viewer", actor="monitor"))
        rows = SchedQueries(reader).pool_waits(run.pool, run.alloc_submit, run.alloc_gpus, MAX_RUNS)
        return [(str(r["job_id"]), float(r["wait"])) for r in rows.to_pylist()]

    def raise_findings(self, findings: FindingsStore, tenant: str, info: RunInfo) -> bool:
        """Store the run's regression findings, and close the ones it no longer earns; False
        while it has no figures to judge."""
        scope = Scope(tenant=tenant, role="viewer", actor="monitor")
        got = self.of(scope, info)
        if got.run is None:
            return False
        live = info.status in LIVE
        worse = {v.tier: v for v in got.verdicts if v.worse}
        found = [_diagnosis(v, got.run, live) for v in worse.values()]
        for f in findings.rows(scope, info.run_id, ("regression",)):
            tier = f.key.removeprefix("regression:")
            if tier not in worse and f.end_step is None:  # no longer worse: it ends here
                closed = _diagnosis(None, got.run, False, f.key, f.diagnosis, f.summary)
                found.append(replace(closed, evidence=list(f.evidence)))
        if found:
            findings.upsert(tenant, info.run_id, found)
        return True

    def _figures(self, tenant: str, runs: list[RunBrief], reread_s: float) -> dict[str, RunFigures]:
        now = time.monotonic()
        out: dict[str, RunFigures] = {}
        todo = []
        with self._lock:
            for r in runs:
                got = self._kept.get((tenant, r.run_id))
                if got is not None and (got[0] == r.last_seen or now - got[1] < reread_s):
                    if got[2] is not None:
                        out[r.run_id] = got[2]
                else:
                    todo.append(r)
        if todo:
            read = _read(self.telemetry, tenant, todo)
            with self._lock:
                if len(self._kept) > 10 * MAX_RUNS:
                    self._kept.clear()
                for r in todo:
                    self._kept[(tenant, r.run_id)] = (r.last_seen, now, read.get(r.run_id))
            out.update(read)
        return out


def _read(telemetry: TelemetryStore, tenant: str, runs: list[RunBrief]) -> dict[str, RunFigures]:
    """The figures of runs with :data:`MIN_STEPS` steps in their newest attempt."""
    scope = Scope(tenant=tenant, role="viewer", actor="monitor")
    reader = TenantReader(telemetry, scope)
    rows = ComparisonQueries(reader).speed([r.run_id for r in runs]).to_pylist()
    speed = {r["run_id"]: r for r in rows}
    q = DetectQueries(telemetry, tenant)
    out = {}
    for brief in runs:
        s = speed.get(brief.run_id)
        if s is None:
            continue
        jobs = q.jobs(brief.run_id)
        if not jobs or jobs[-1].last_step - jobs[-1].first_step + 1 < MIN_STEPS:
            continue
        newest = jobs[-1]
        started, envs = q.job_start(brief.run_id, newest.job_id)
        sw, mixed = software(envs)
        for k, values in mixed.items():  # ranks that disagree are a software of their own
            sw[k] = f"{sw[k]} (mixed: {', '.join(values)})"
        sw.update({k: str(brief.config[k]) for k in CONFIG_SOFTWARE_KEYS if k in brief.config})
        startup = newest.start - started if started is not None and len(jobs) == 1 else None
        step_s = float(s["median_step_s"]) if s["median_step_s"] else None
        # Tokens a second at the median step (a step's tokens over the median step time), as
        # robust as the program tier's figure: a run's mean rate moves with its few slow steps.
        per_step = float(s["tokens_per_s"] or 0.0) * float(s["mean_step_s"] or 0.0)
        tokens = per_step / step_s if step_s else 0.0
        ranks = int(s["ranks"] or brief.world_size or 1)
        gaps = [b.start - a.end for a, b in itertools.pairwise(jobs) if b.start >= a.end]
        pauses = save_pauses(Event.from_row(r) for r in q.checkpoint_ends(brief.run_id))[1]
        alloc = _first_allocation(telemetry, scope, brief.run_id)
        spec = program_spec(brief.config)
        mfu = None
        if spec.missing is None:  # its config names FLOPs and a peak: MFU of retained steps
            _, factors, how = GoodputQueries(telemetry, scope).run_goodput(brief.run_id, spec)
            if how.program_basis == "mfu_retained_steps" and (how.retained_flops or 0) > 0:
                mfu = factors.program  # (FLOPs a token with no tokens logged: none)
        out[brief.run_id] = RunFigures(
            run_id=brief.run_id,
            t_first=float(s["t_first"]),
            software=sw,
            step_s=step_s,
            startup_s=startup if startup is not None and startup >= 0 else None,
            steps=int(s["n_steps"]),
            from_step=newest.first_step,
            to_step=newest.last_step,
            world_size=int(brief.world_size),
            mfu=mfu,
            # tokens a second per rank; without tokens, steps a second (a rank's batch is fixed)
            gpu_rate=tokens / ranks if tokens > 0 else (1.0 / step_s if step_s else None),
            gpu_s_per_token=ranks / tokens if tokens > 0 and mfu is None else None,
            recovery_s=float(np.median(gaps)) if gaps else None,
            checkpoint_s=float(np.median(pauses)) if pauses else None,
            alloc_s=alloc[0] if alloc else None,
            pool=alloc[1] if alloc else None,
            alloc_submit=alloc[2] if alloc else None,
            alloc_gpus=alloc[3] if alloc else 0,
            workload=workload_key(brief.config, brief.world_size),
            architecture=architecture_key(brief.config),
        )
    return out


def _first_allocation(
    telemetry: TelemetryStore, scope: Scope, run_id: str
) -> tuple[float, str, float, int] | None:
    """The run's first scheduler allocation that completed its gang: its wait from submission
    to gang completion, its pool, its submission time and GPUs."""
    for a in allocation_records(telemetry, scope, run_id=run_id, limit=100):
        if a.submit is not None and a.gang_complete is not None and not a.gang_never_complete:
            return a.gang_complete - a.submit, a.pool, a.submit, a.gpus
    return None


def _diagnosis(
    v: Verdict | None,
    run: RunFigures,
    live: bool,
    key: str = "",
    diagnosis: str = "",
    summary: str = "",
) -> Diagnosis:
    """A tier's finding: ``v`` worse than its bound (ongoing while the run is live), or, with
    ``v`` None, the stored finding ``key`` ended at the run's last step."""
    evidence: list[Evidence] = []
    if v is not None:
        change = f"; coincides with {', '.join(v.changes)}" if v.changes else ""
        ratio = f" ({v.ratio:.2f}x)" if v.ratio is not None else ""
        summary = (
            f"{TIERS[v.tier].what} {_said(v.tier, v.value)} against "
            f"{_said(v.tier, v.baseline)}, the median of {len(v.runs)} {_OF[v.tier]}"
            f"{ratio}{change}"
        )
        key, diagnosis = f"regression:{v.tier}", DIAGNOSES[v.tier]
        evidence = [_evidence(v)]
    return Diagnosis(
        key=key,
        diagnosis=diagnosis,
        kind="regression",
        # as sure as the figure is far over its bound, but never the likeliest cause of a
        # failure: a regression says the run is slow, not why it stopped
        confidence=0.7 if v is None else min(0.7, 0.4 + 0.3 * abs(v.value - v.bound) / v.bound),
        summary=summary,
        step=run.from_step,
        start_step=run.from_step,
        end_step=-1 if live and v is not None else run.to_step,
        evidence=evidence,
    )


def _evidence(v: Verdict) -> Evidence:
    return {
        "signal": "regression",
        "metric": TIERS[v.tier].what,
        "value": v.value,
        "baseline": v.baseline,
        "threshold": v.bound,
        "baseline_runs": v.runs,
        "baseline_software": v.software,
        "changes": v.changes,
    }
