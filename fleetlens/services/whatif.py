"""A run's what-if (``GET /v1/runs/{id}/whatif/stragglers``, ``fleetlens whatif RUN``): how much
faster its newest attempt would run with its workers, its pipeline stages, its input or its
data-parallel transfer at their peers' median, and with each finding's ranks or stage made
ideal (:mod:`fleetlens.analysis.whatif`), over a bounded window of its steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..analysis.layout import ParallelLayout, layout_of
from ..analysis.whatif import StepWhatIf, Target, step_whatif
from ..store.detect_queries import DetectQueries
from ..store.findings import FindingRow
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore

__all__ = ["MAX_CELLS", "RunWhatIf", "run_whatif"]

MAX_CELLS = 4_000_000
"""Rank-steps read at most: the newest steps of the attempt that fit (16,384 ranks: 244)."""


@dataclass(frozen=True)
class RunWhatIf:
    job_id: str
    from_step: int
    to_step: int
    layout: ParallelLayout | None
    result: StepWhatIf
    findings: list[FindingRow]  # the findings the what-if made ideal, in ``result.by_target``


def _target(f: FindingRow) -> Target | None:
    end = -1 if f.end_step is None else int(f.end_step)
    if f.diagnosis == "batch_imbalance":
        return Target(f.key, start=f.start_step, end=end, batches=True)
    if f.diagnosis == "stage_imbalance" and f.evidence:
        return Target(f.key, stage=int(f.evidence[0].get("stage", -1)), start=f.start_step, end=end)
    if f.kind == "straggler" and f.ranks:
        return Target(f.key, ranks=tuple(f.ranks), start=f.start_step, end=end)
    return None


def run_whatif(
    telemetry: TelemetryStore,
    scope: Scope,
    run_id: str,
    config: dict[str, Any],
    findings: list[FindingRow],
    from_step: int | None = None,
    to_step: int | None = None,
) -> RunWhatIf | None:
    """The what-if of the run's newest attempt over ``from_step``..``to_step`` (default: its
    newest steps, at most :data:`MAX_CELLS` rank-steps); None before its first step."""
    q = DetectQueries(telemetry, scope.tenant)
    jobs = q.jobs(run_id)
    if not jobs:
        return None
    job = jobs[-1]
    world = max(job.world, 1)
    hi = min(job.last_step, to_step) if to_step is not None else job.last_step
    lo = max(job.first_step, from_step or 0, hi - MAX_CELLS // world + 1)
    m = q.step_matrix(run_id, job.job_id, lo, hi, world)
    layout = layout_of(config, m.world)
    pipeline = layout is not None and layout.pp > 1
    stages = layout.stages(m.world) if layout is not None and pipeline else None
    replicas = layout.replicas(m.world) if layout is not None and pipeline else None
    mine = [f for f in findings if f.job_id in (None, "", job.job_id)]
    targets = [t for f in mine if (t := _target(f)) is not None]
    result = step_whatif(
        m.steps, m.compute, m.data_wait, m.end - m.start, stages, targets, replicas
    )
    made = {t.key for t in targets}
    return RunWhatIf(job.job_id, lo, hi, layout, result, [f for f in mine if f.key in made])
