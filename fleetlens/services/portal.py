"""Reads the web portal draws: step-time bands and the rank x step heatmap, downsampled here.

A chart is a few hundred pixels wide, so nothing here returns more points than that: the step
series comes from the per-step rollup ``steps_by_step`` bucketed to ``points`` step buckets, and
the heatmap from the per-rank ``steps`` table bucketed to rank buckets x step buckets with the
maximum compute time per cell (a max keeps one slow rank visible in a bucket of many). The
statements are those of :class:`~fleetlens.store.portal_queries.PortalStoreQueries`, bound to the
caller's scope given at construction; :meth:`PortalQueries.node_events` reads every tenant's
node events for infrastructure on-call (``Scope.cross_tenant_infra``), and nothing of their runs
but the run id.

The run page's first paint reads the rollup once: :meth:`PortalQueries.executions` returns every
step execution (``FINAL`` merges the rollup's partial rows in the engine, far cheaper than a
GROUP BY over 100,000 steps), and pure functions here derive the step-time series
(:func:`step_buckets`) and the summary (:func:`run_summary`) from it while the goodput breakdown
reads the same rows (:meth:`PortalQueries.run_goodput`); :func:`run_overview` composes the page's
first paint of them (typed values: :mod:`.portal_types`; the API makes the JSON).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ..analysis.breakdown import Breakdown, StepArrays
from ..analysis.goodput import Factors
from ..analysis.layout import layout_of
from ..analysis.nanstats import nanmedian
from ..store.findings import FindingsStore
from ..store.metadata import MetadataStore
from ..store.portal_queries import PortalStoreQueries
from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore
from .goodput import GoodputQueries, ProgramFigures, ProgramSpec, program_spec
from .portal_types import (
    Heatmap,
    HotRow,
    NodeEvent,
    OverviewSteps,
    OverviewWindow,
    PortalEvent,
    RecentSpread,
    RunOverview,
    StepBucket,
)
from .runs import RecentSteps, RunQueries, completion, declared_world, summarize
from .runs_types import RunSummary
from .scheduler import run_scheduling_factor
from .series import SeriesPoint

__all__ = [
    "HEATMAP_ROWS_BUDGET",
    "Executions",
    "PortalQueries",
    "run_overview",
    "run_summary",
    "step_buckets",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

HEATMAP_ROWS_BUDGET = 2_000_000
"""Rank-step rows the default heatmap window reads: ~2,000 steps at 1,024 ranks, ~120 at 16k."""
OVERVIEW_SCALARS = ("loss", "lr", "grad_norm")
"""The scalars the run page charts (all of them when the run logs fewer than six)."""
TIMELINE_STEPS = 5_000
"""The run page's first paint shows the timeline of the window's last steps (2,000 items)."""


def _f(x: Any) -> float | None:
    if x is None:
        return None
    v = float(x)
    return v if math.isfinite(v) else None


def _r(x: Any, digits: int = 4) -> float | None:
    v = _f(x)
    return None if v is None else round(v, digits)


def _col(x: F64, digits: int = 4) -> list[float | None]:
    """An array rounded for JSON, non-finite values as None."""
    return [v if math.isfinite(v) else None for v in np.round(x, digits).tolist()]


def _g(x: Any, digits: int = 6) -> float | str | None:
    """A chart value to ``digits`` significant digits; NaN and Inf as strings (they are signals)."""
    if x is None:
        return None
    v = float(x)
    return float(f"{v:.{digits}g}") if math.isfinite(v) else str(v)


@dataclass(frozen=True)
class Executions:
    """A run's step executions, one per step and job attempt (a restart replays steps), as the
    rollup has them: start, end, the slowest rank's duration and compute, the mean rank's
    duration and compute, ranks, tokens and the longest input wait."""

    step: I64
    job_id: npt.NDArray[Any]
    start: F64
    end: F64
    max_duration: F64
    mean_duration: F64
    max_compute: F64
    mean_compute: F64
    ranks: I64
    tokens: I64
    data_wait: F64

    def __len__(self) -> int:
        return len(self.step)

    def take(self, idx: npt.NDArray[np.intp]) -> Executions:
        return Executions(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    def latest(self) -> Executions:
        """One row per step, its latest attempt (the one that counts), in step order."""
        if not len(self) or bool(np.all(np.diff(self.step) > 0)):
            return self  # the usual case: no step was replayed, and the rows are in order
        by_start = np.argsort(self.start, kind="stable")
        order = by_start[np.argsort(self.step[by_start], kind="stable")]
        s = self.step[order]
        return self.take(order[np.r_[s[1:] != s[:-1], True]])

    def goodput_input(self) -> tuple[StepArrays, dict[str, float]]:
        """What :meth:`GoodputQueries.step_executions` answers, from these rows."""
        if not len(self):
            return StepArrays.empty(), {"tokens": 0.0, "ranks": 0.0}
        arrays = StepArrays(
            step=self.step,
            job_id=self.job_id,
            start=self.start,
            end=self.end,
            max_compute=self.max_compute,
            mean_compute=self.mean_compute,
            data_wait=np.nan_to_num(self.data_wait, nan=0.0),
        )
        extra = {
            "tokens_per_step": float(np.mean(self.tokens)),
            "ranks": float(self.ranks[np.argmax(self.start)]),
        }
        return arrays, extra


def step_buckets(per_step: Executions, lo: int, hi: int, points: int) -> list[StepBucket]:
    """Per bucket of steps in [lo, hi] (``points`` buckets at most), from one row per step (see
    :meth:`Executions.latest`): the job's step time (median, min and max over the bucket's
    steps), the slowest and the mean rank's compute (bucket means), tokens and tokens/s."""
    width = max(1, math.ceil((hi - lo + 1) / max(1, points)))
    sel = (per_step.step >= lo) & (per_step.step <= hi)
    step = per_step.step[sel]
    if not len(step):
        return []
    dur, start, end = per_step.max_duration[sel], per_step.start[sel], per_step.end[sel]
    tokens = per_step.tokens[sel]
    b = (step - lo) // width
    first = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    count = np.diff(np.r_[first, len(step)])
    med = np.empty(len(first))
    for k, (i, n) in enumerate(zip(first.tolist(), count.tolist(), strict=True)):
        d = np.sort(dur[i : i + n])
        med[k] = (d[(n - 1) // 2] + d[n // 2]) / 2.0
    tok = np.add.reduceat(tokens, first)
    busy = np.add.reduceat(end - start, first)
    with np.errstate(divide="ignore", invalid="ignore"):
        tps = np.where(busy > 0, tok / busy, np.nan)
    cols = zip(
        step[first].tolist(),
        count.tolist(),
        _col(np.minimum.reduceat(start, first), 1),
        _col(med),
        _col(np.maximum.reduceat(dur, first)),
        _col(np.minimum.reduceat(dur, first)),
        _col(np.add.reduceat(per_step.max_compute[sel], first) / count),
        _col(np.add.reduceat(per_step.mean_compute[sel], first) / count),
        tok.tolist(),
        _col(tps, 1),
        strict=True,
    )
    return [StepBucket(*c) for c in cols]


def run_summary(
    per_step: Executions, latest: dict[str, float | None], window: int = 100
) -> RunSummary:
    """:func:`fleetlens.services.runs.summarize` from one row per step (see
    :meth:`Executions.latest`): the run page's summary is the API's."""
    if not len(per_step):
        return summarize(0, 0, 0, RecentSteps.empty(), latest)
    rec = per_step.step > int(per_step.step[-1]) - window
    recent = RecentSteps(
        per_step.step[rec],
        per_step.start[rec],
        per_step.end[rec],
        per_step.max_duration[rec],
        per_step.mean_duration[rec],
        per_step.tokens[rec],
        per_step.ranks[rec],
    )
    return summarize(
        len(per_step), int(per_step.step[-1]), int(np.sum(per_step.tokens)), recent, latest
    )


class PortalQueries:
    def __init__(self, telemetry: TelemetryStore, scope: Scope) -> None:
        self.t = telemetry
        self.tenant = scope.tenant
        self.q = PortalStoreQueries(TenantReader(telemetry, scope))

    def step_range(self, run_id: str) -> tuple[int, int, int] | None:
        """First step, last step and the latest step's rank count (from the rollup: until the
        engine merges them, a step has a partial row per insert that held some of its ranks, so
        the last step's rows are added up, for its latest attempt)."""
        bounds = self.q.step_bounds(run_id)
        if bounds is None:
            return None
        return bounds[0], bounds[1], self.q.ranks_at(run_id, bounds[1])

    def executions(self, run_id: str, lo: int | None = None, hi: int | None = None) -> Executions:
        """Every step execution of the run, or of its steps in [lo, hi] (one scan of the rollup;
        ``FINAL`` merges its partial rows per step and attempt, as a GROUP BY step, job_id
        would)."""
        table = self.q.executions(run_id, lo, hi)

        def num(name: str, dtype: type) -> Any:
            if not table.num_rows:
                return np.zeros(0, dtype)
            return table.column(name).to_numpy(zero_copy_only=False).astype(dtype)

        if table.num_rows:
            # Decode the job ids once per distinct id, not once per row.
            jobs = pc.dictionary_encode(table.column("job_id").cast(pa.string())).combine_chunks()
            names = np.asarray(jobs.dictionary.to_pylist(), dtype=object)
            job_id = names[jobs.indices.to_numpy(zero_copy_only=False)]
        else:
            job_id = np.zeros(0, object)
        return Executions(
            step=num("step", np.int64),
            job_id=job_id,
            start=num("e_start", np.float64),
            end=num("e_end", np.float64),
            max_duration=num("e_dur", np.float64),
            mean_duration=num("e_dmean", np.float64),
            max_compute=num("e_cmax", np.float64),
            mean_compute=num("e_cmean", np.float64),
            ranks=num("e_ranks", np.int64),
            tokens=num("e_tokens", np.int64),
            data_wait=num("e_wait", np.float64),
        )

    def run_goodput(
        self, run_id: str, rows: Executions, spec: ProgramSpec, scheduling: float = 1.0
    ) -> tuple[Breakdown, Factors, ProgramFigures]:
        """:meth:`GoodputQueries.run_goodput` of the whole run over ``rows``, read already."""
        return GoodputQueries(self.t, self.tenant).run_goodput(
            run_id, spec, scheduling=scheduling, executions=rows.goodput_input()
        )

    def latest_scalars(self, run_id: str, limit: int = 200) -> dict[str, float | None]:
        """Each scalar's latest value (highest step, then time), by name."""
        rows = self.q.latest_scalars(run_id, limit).to_pylist()
        return {r["name"]: _f(r["value"]) for r in rows}

    def scalar_series(
        self, run_id: str, names: list[str], lo: int, hi: int, points: int
    ) -> dict[str, list[SeriesPoint]]:
        """Several scalars in one scan, as :meth:`SeriesQueries.series` shapes one: per bucket
        of steps, the first, min, max and mean of the lowest rank's value at each step (six
        significant digits), and how many were not finite (kept as strings: "nan", "inf")."""
        if not names:
            return {}
        width = max(1, math.ceil((hi - lo + 1) / max(1, points)))
        rows = self.q.scalar_buckets(run_id, names, lo, hi, width).to_pylist()
        out: dict[str, list[SeriesPoint]] = {n: [] for n in names}
        for r in rows:
            out[r["name"]].append(
                SeriesPoint(
                    step=int(r["v_step"]),
                    value=_g(r["v_first"]),
                    min=_g(r["v_min"]),
                    max=_g(r["v_max"]),
                    mean=_g(r["v_mean"]),
                    non_finite=int(r["v_bad"]),
                )
            )
        return out

    def step_series(self, run_id: str, lo: int, hi: int, points: int) -> list[StepBucket]:
        """:func:`step_buckets` over the steps in [lo, hi] (a replayed step counts once, at its
        latest attempt)."""
        return step_buckets(self.executions(run_id, lo, hi).latest(), lo, hi, points)

    def heatmap(
        self, run_id: str, lo: int, hi: int, world: int, rank_buckets: int, step_buckets: int
    ) -> Heatmap:
        """Rank buckets x step buckets of the maximum compute time (ms) per cell, the hot row
        (highest median ratio to its column's median) and the slowest rank inside it, and per
        row the rank that was the slowest in most of its cells (``rowRank``)."""
        rw = max(1, math.ceil(max(world, 1) / max(1, rank_buckets)))
        sw = max(1, math.ceil((hi - lo + 1) / max(1, step_buckets)))
        table = self.q.compute_cells(run_id, lo, hi, rw, sw)
        n_rows = max(1, math.ceil(max(world, 1) / rw))
        n_cols = max(1, math.ceil((hi - lo + 1) / sw))
        grid = np.full((n_rows, n_cols), np.nan)
        # Each row's rank a click opens: the one slowest in most of the row's cells.
        pick = list(range(0, n_rows * rw, rw))
        if table.num_rows:
            rb = table.column("h_rb").to_numpy().astype(np.int64)
            sb = table.column("h_sb").to_numpy().astype(np.int64)
            v = table.column("h_max").to_numpy(zero_copy_only=False).astype(np.float64)
            ok = (rb >= 0) & (rb < n_rows) & (sb >= 0) & (sb < n_cols)
            grid[rb[ok], sb[ok]] = v[ok] * 1000.0
            slow = table.column("h_rank").to_numpy().astype(np.int64)
            pairs, counts = np.unique(np.c_[rb[ok], slow[ok]], axis=0, return_counts=True)
            for k in np.argsort(counts, kind="stable"):  # the most frequent is written last
                pick[int(pairs[k, 0])] = int(pairs[k, 1])
        hot: HotRow | None = None
        with np.errstate(all="ignore"):
            col_med = nanmedian(np.where(np.isfinite(grid), grid, np.nan), axis=0)
            ratio = grid / col_med
            row_score = nanmedian(np.where(np.isfinite(ratio), ratio, np.nan), axis=1)
        if np.isfinite(row_score).any():
            row = int(np.nanargmax(row_score))
            hot = HotRow(
                row=row,
                rank_from=row * rw,
                rank_to=min(world, (row + 1) * rw) - 1,
                ratio=_r(row_score[row]),
                rank=self.q.slowest_rank(run_id, lo, hi, row * rw, (row + 1) * rw - 1),
            )
        cells = [[None if not math.isfinite(x) else round(float(x), 1) for x in r] for r in grid]
        return Heatmap(
            from_step=lo,
            to_step=hi,
            ranks_per_row=rw,
            steps_per_column=sw,
            rows=n_rows,
            columns=n_cols,
            cells=cells,
            hot=hot,
            row_rank=pick,
        )

    def recent_spread(self, run_id: str, window: int = 100) -> RecentSpread | None:
        """Per-rank spread over the last ``window`` steps: (slowest - mean compute) / mean."""
        recent = self.q.recent_compute(run_id, window)
        if not recent.steps:
            return None
        mx, mean = _f(recent.max_compute), _f(recent.mean_compute)
        return RecentSpread(
            steps=recent.steps,
            compute_max_ms=None if mx is None else round(mx * 1000, 2),
            compute_mean_ms=None if mean is None else round(mean * 1000, 2),
            spread=(mx - mean) / mean if mx is not None and mean else None,
        )

    def events(
        self, kinds: tuple[str, ...], since: float, run_id: str | None = None, limit: int = 500
    ) -> list[PortalEvent]:
        """Events of the given kinds after ``since`` (all the tenant's runs, or one)."""
        rows = self.q.events(kinds, since, run_id, limit).to_pylist()
        return [
            PortalEvent(
                time=r["time"],
                run_id=r["run_id"],
                job_id=r["job_id"],
                step=int(r["step"]) if r["step"] >= 0 else None,
                rank=int(r["rank"]) if r["rank"] >= 0 else None,
                kind=r["kind"],
                node=r["node_id"] or None,
                gpu=int(r["gpu"]) if r["gpu"] >= 0 else None,
                message=r["message"],
            )
            for r in rows
        ]

    def node_events(
        self, kinds: tuple[str, ...], since: float, limit: int = 500
    ) -> list[NodeEvent]:
        """Events of the given kinds on a node after ``since``, each with its tenant, for
        infrastructure on-call: every tenant's for a cross-tenant scope (role oncall), else the
        caller's tenant's. Only where, when and what happened to the node: no rank or step."""
        rows = self.q.node_events(kinds, since, limit).to_pylist()
        return [
            NodeEvent(
                time=r["time"],
                tenant=r["n_tenant"],
                run_id=r["run_id"],
                kind=r["kind"],
                node=r["node_id"],
                gpu=int(r["gpu"]) if r["gpu"] >= 0 else None,
                message=r["message"],
            )
            for r in rows
        ]

    def nodes_of(self, runs: list[str]) -> dict[str, list[str]]:
        """Node -> the given runs placed on it (any of their job attempts)."""
        if not runs:
            return {}
        rows = self.q.nodes_of(runs).to_pylist()
        return {r["p_node"]: sorted(r["p_runs"]) for r in rows}


def run_overview(
    metadata: MetadataStore,
    telemetry: TelemetryStore,
    scope: Scope,
    run_id: str,
    points: int,
    from_step: int | None = None,
    to_step: int | None = None,
    mark: Callable[[str], object] = lambda _: None,
) -> RunOverview:
    """What the run page draws on first paint: the series and the timeline over [from_step,
    to_step] of the run's steps (all of them by default) at ``points`` buckets; the summary,
    goodput and findings (most costly first) of the whole run. One read of the rollup serves the
    summary, the step series, the goodput and the costs. ``mark(part)`` is called as each part
    is done (the API times them; ``part`` in snake_case)."""
    from .portal_costs import finding_costs  # it reads this module's Executions

    info = metadata.get_run(scope, run_id)
    pq = PortalQueries(telemetry, scope)
    config = info.config or {}
    mark("run")
    executions = pq.executions(run_id)
    per_step = executions.latest()
    mark("steps")
    latest = pq.latest_scalars(run_id)
    summary = declared_world(run_summary(per_step, latest), metadata.jobs(scope, run_id))
    layout = layout_of(config, int(summary.world_size or info.world_size or 0))
    mark("summary")
    if not len(per_step):
        return RunOverview(info=info, summary=summary, layout=layout, steps=None)
    first, last = int(per_step.step[0]), int(per_step.step[-1])
    lo = first if from_step is None else max(first, from_step)
    hi = last if to_step is None else min(last, to_step)
    series = step_buckets(per_step, lo, hi, points)
    mark("step_series")
    names = [n for n in latest if n in OVERVIEW_SCALARS or len(latest) < 6]
    scalars = pq.scalar_series(run_id, names, lo, hi, points)
    mark("scalars")
    sched = run_scheduling_factor(telemetry, scope, run_id)  # as GET .../goodput has it
    bd, f, program = pq.run_goodput(run_id, executions, program_spec(config), sched.factor)
    mark("goodput")
    # The recent part on first paint; the page asks /timeline for any other window.
    rq = RunQueries(telemetry, scope)
    timeline = rq.timeline(run_id, max(lo, hi - TIMELINE_STEPS + 1), hi)[:2000]
    mark("timeline")
    found = FindingsStore(metadata).rows(scope, run_id, None)
    devices = float(program.devices or info.world_size or 0)
    ranked, unattributed = finding_costs(found, bd, executions, devices)
    mark("costs")
    steps = OverviewSteps(
        window=OverviewWindow(from_step=lo, to_step=hi, run_from_step=first, run_to_step=last),
        step_series=series,
        scalars=scalars,
        breakdown=bd,
        factors=f,
        program=program,
        timeline=timeline,
        findings=ranked,
        unattributed=unattributed,
        completion=completion(config, summary, info.status),
    )
    return RunOverview(info=info, summary=summary, layout=layout, steps=steps)
