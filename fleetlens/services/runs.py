"""What the API says of one tenant's run: its summary, per-rank windows, timeline.

Every read is bound to the caller's scope given at construction, and its statement is in
:mod:`fleetlens.store.run_queries`: an endpoint cannot forget to scope a query because it never
writes one. The run itself is checked against the scope's project by the metadata store before
any of these run (the API does that first).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ..analysis.changes import MetricChange, series_changes
from ..analysis.hardware import GpuHealth, NodeHealth, gpu_health, node_health
from ..errors import ConfigError
from ..store.detect_queries import DetectQueries, by_placed_span
from ..store.metadata import JobInfo
from ..store.reader import TenantReader
from ..store.run_queries import RANK_SORT_KEYS, RunTelemetryQueries
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore
from .runs_types import (
    Completion,
    MetricChangeItem,
    RankFigures,
    RankHardware,
    RunSummary,
    SummaryWindow,
    TimelineEvent,
    TimelineItem,
)

__all__ = ["RecentSteps", "RunQueries", "summarize"]

MAX_TIMELINE_STEPS = 1_000_000


def _f(x: Any) -> float | None:
    if x is None:
        return None
    v = float(x)
    return v if math.isfinite(v) else None


@dataclass(frozen=True)
class RecentSteps:
    """The last steps of a run, one row per step (its latest attempt), in step order."""

    step: npt.NDArray[np.int64]
    start: npt.NDArray[np.float64]
    end: npt.NDArray[np.float64]
    max_duration: npt.NDArray[np.float64]  # the slowest rank's
    mean_duration: npt.NDArray[np.float64]  # the mean rank's
    tokens: npt.NDArray[np.int64]
    ranks: npt.NDArray[np.int64]

    @classmethod
    def empty(cls) -> RecentSteps:
        return cls.from_rows([])

    @classmethod
    def from_rows(cls, rows: list[dict[str, Any]]) -> RecentSteps:
        def col(name: str, dtype: type) -> Any:
            return np.asarray([r[name] for r in rows], dtype=dtype)

        return cls(
            col("step", np.int64),
            col("start", np.float64),
            col("end", np.float64),
            col("max_duration", np.float64),
            col("mean_duration", np.float64),
            col("tokens", np.int64),
            col("ranks", np.int64),
        )


def summarize(
    steps: int, last_step: int, tokens: int, recent: RecentSteps, latest: dict[str, float | None]
) -> RunSummary:
    """A run's progress and speed, the one definition the API, the monitor and the run page
    share: its step count, last step and tokens, and over the recent steps the median step time
    (slowest rank) and mean rank's step time, tokens/s over the time they were busy, and the
    world size at the last step. ``latest`` is each scalar's latest value."""
    if not steps or not len(recent.step):
        return RunSummary(steps=0, step=None, tokens_processed=0, scalars={})
    busy = float(np.sum(recent.end - recent.start))
    span = int(recent.step[-1] - recent.step[0])
    wall = float(recent.end[-1] - recent.end[0]) / span if span > 0 else None
    return RunSummary(
        steps=steps,
        step=last_step,
        tokens_processed=tokens,
        scalars=dict(latest),
        window=SummaryWindow(
            from_step=int(recent.step[0]), to_step=int(recent.step[-1]), steps=len(recent.step)
        ),
        step_time_ms=_f(np.median(recent.max_duration) * 1000.0),
        mean_rank_step_time_ms=_f(np.median(recent.mean_duration) * 1000.0),
        tokens_per_second=_f(np.sum(recent.tokens) / busy) if busy > 0 else None,
        # wall-clock seconds per step over the window, from step end to step end: with what
        # happens between steps (data stalls, checkpoints, evaluation, logging)
        wall_seconds_per_step=_f(wall) if wall is not None and wall > 0 else None,
        world_size=int(recent.ranks[-1]),
    )


def declared_world(summary: RunSummary, jobs: list[JobInfo]) -> RunSummary:
    """The summary with its world size as the job declared it, and the ranks that report steps
    as ``ranks_reporting``: the telemetry's count is the ranks of the newest step, which is
    fewer when some ranks do not report (or an imported log's one rank stands for the job). The
    one rule of the API's run and the run page."""
    declared = jobs[-1].world_size if jobs else 0
    if not summary.world_size:
        return summary
    return replace(
        summary,
        ranks_reporting=summary.world_size,
        world_size=max(declared, summary.world_size),
    )


TARGET_KEYS = ("total_steps", "max_steps", "train_steps", "train_iters", "max_iters",
               "num_training_steps", "steps")  # fmt: skip
"""Config keys naming a run's last step count, first found wins: generic, HF ``max_steps``
(Lightning's too), Megatron ``train_iters``, nanoGPT ``max_iters``."""

TOKEN_TARGET_KEYS = ("total_tokens", "train_tokens", "target_tokens", "max_tokens", "num_tokens")
"""Config keys naming a run's token budget, when it names no step count (a token-budgeted
pretraining run): the steps left are the tokens left at its tokens per step so far."""


def step_target(config: dict[str, Any]) -> tuple[str, int] | None:
    """The config's target step count and the key it is under (:data:`TARGET_KEYS`)."""
    key = next((k for k in TARGET_KEYS if _count(config.get(k))), None)
    return None if key is None else (key, int(config[key]))


def completion(config: dict[str, Any], summary: RunSummary, status: str) -> Completion | None:
    """When a live run will reach its target step: the steps left (from the config's target,
    :data:`TARGET_KEYS`) at the recent wall-clock pace (``wall_seconds_per_step``: what happens
    between steps counts); None unless it is RUNNING (ended, hung or stalled: no pace to go
    by), or without a target or a pace."""
    target = step_target(config)
    pace, step = summary.wall_seconds_per_step, summary.step
    if status != "RUNNING" or not pace or step is None:
        return None
    tokens_left: int | None = None
    if target is not None:
        key, total = target
        left = max(0, total - 1 - int(step))  # steps count from 0: the last is total - 1
    else:
        tkey = next((k for k in TOKEN_TARGET_KEYS if _count(config.get(k))), None)
        done, steps = int(summary.tokens_processed or 0), int(summary.steps or 0)
        if tkey is None or done <= 0 or steps <= 0:
            return None
        key = tkey
        tokens_left = max(0, int(config[key]) - done)
        left = math.ceil(tokens_left / (done / steps))  # at its tokens per step so far
        total = int(step) + 1 + left
    return Completion(
        total_steps=total,
        target_key=key,
        steps_left=left,
        seconds_per_step=pace,
        seconds=left * pace,
        finish_at=time.time() + left * pace,
        tokens_left=tokens_left,
    )


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


class RunQueries:
    def __init__(self, telemetry: TelemetryStore, scope: Scope) -> None:
        self.t = telemetry
        self.tenant = scope.tenant
        self.q = RunTelemetryQueries(TenantReader(telemetry, scope))

    def summary(self, run_id: str, window: int = 100) -> RunSummary:
        """Progress and speed: last step, tokens, and step time / tokens/s over recent steps
        (:func:`summarize` over the run's totals and its last ``window`` steps)."""
        total = self.q.step_totals(run_id)
        if not total.steps:
            return summarize(0, 0, 0, RecentSteps.empty(), {})
        recent = self.q.recent_steps(run_id, total.last_step, window).to_pylist()
        latest = self.q.latest_scalars(run_id).to_pylist()
        return summarize(
            total.steps,
            total.last_step,
            total.tokens,
            RecentSteps.from_rows(recent),
            {r["name"]: _f(r["latest"]) for r in latest},
        )

    def step_window(
        self, run_id: str, from_step: int | None, to_step: int | None, default: int = 100
    ) -> tuple[int, int] | None:
        if from_step is not None and to_step is not None:
            return from_step, to_step
        last = self.q.last_step(run_id)
        if last is None:
            return None
        hi = to_step if to_step is not None else last
        lo = from_step if from_step is not None else max(0, hi - default + 1)
        return lo, hi

    def ranks(
        self, run_id: str, from_step: int, to_step: int, sort: str, descending: bool, limit: int
    ) -> list[RankFigures]:
        """Per rank over a step window: compute (median), step time, data wait, communication."""
        if sort not in RANK_SORT_KEYS:
            raise ConfigError(f"unknown sort key {sort!r}")
        # The window's latest job attempt places the ranks (a restart may move them).
        job = self.q.window_job(run_id, from_step, to_step)
        rows = self.q.rank_figures(
            run_id, from_step, to_step, job, sort, descending, limit
        ).to_pylist()
        out = []
        for r in rows:
            med, med_c = _f(r["median_all"]), _f(r["median_compute"])
            out.append(
                RankFigures(
                    rank=int(r["rank"]),
                    node=r["p_node"] or None,
                    gpu=int(r["p_gpu"]) if r["p_node"] and r["p_gpu"] is not None else None,
                    gpu_uuid=r["p_uuid"] or None,
                    rack=r["p_rack"] or None,
                    job_id=job or None,
                    steps=int(r["r_steps"]),
                    step_time_ms=_ms(r["r_step_time"]),
                    max_step_time_ms=_ms(r["r_max_step_time"]),
                    data_wait_ms=_ms(r["r_data_wait"]),
                    comm_ms=_ms(r["r_comm"]),
                    compute_ms=_ms(r["r_compute"]),
                    slowdown=(_f(r["r_step_time"]) or 0.0) / med if med else None,
                    compute_slowdown=(_f(r["r_compute"]) or 0.0) / med_c if med_c else None,
                )
            )
        return self.hardware(run_id, out, from_step, to_step)

    def hardware(
        self, run_id: str, ranks: list[RankFigures], from_step: int, to_step: int
    ) -> list[RankFigures]:
        """``ranks`` with each one's GPU and host evidence over the window's time span (as they
        were when no rank has a node or the window no steps)."""
        nodes = sorted({r.node for r in ranks if r.node})
        if not nodes:
            return ranks
        t0, t1 = self.q.step_span(run_id, from_step, to_step)
        if t0 is None or t1 is None:
            return ranks
        dq = DetectQueries(self.t, self.tenant)
        gpus: dict[tuple[str, int], GpuHealth] = {}
        hosts: dict[str, NodeHealth] = {}
        t0, t1 = t0 - 60, t1 + 60
        # Only while this run was on each node: the same node name in another run's time
        # (before, after, between this run's attempts) is not this run's evidence.
        for (a, b), on in by_placed_span(dq.placed(run_id), nodes, t0, t1).items():
            gpus.update(gpu_health(dq.gpu_health_rows(on, a, b)))
            hosts.update(node_health(dq.node_health_rows(on, a, b)))
        out = []
        for r in ranks:
            g = gpus.get((r.node, r.gpu)) if r.node and r.gpu is not None else None
            h = hosts.get(r.node) if r.node else None
            out.append(replace(r, hardware=_hardware(g, h), hardware_read=True))
        return out

    def timeline(self, run_id: str, from_step: int, to_step: int) -> list[TimelineItem]:
        """Events and metric changes in a step window, in order."""
        if to_step - from_step > MAX_TIMELINE_STEPS:
            raise ConfigError(f"a timeline covers at most {MAX_TIMELINE_STEPS} steps")
        t0, t1 = self.q.step_span(run_id, from_step, to_step)
        t0, t1 = _f(t0), _f(t1)
        # Events of no step (a rank's job_start, finish, signal) before the run's first step
        # or after its last belong to the window that holds that step.
        s0, s1 = self.q.step_range(run_id)
        if t0 is not None and s0 is not None and from_step <= s0:
            t0 = 0.0
        if t1 is not None and s1 is not None and to_step >= s1:
            t1 = 1e300
        events = self.q.window_events(
            run_id,
            from_step,
            to_step,
            t0 if t0 is not None else 0.0,
            t1 if t1 is not None else -1.0,
        ).to_pylist()
        items: list[TimelineItem] = [
            TimelineEvent(
                step=int(e["step"]) if e["step"] >= 0 else None,
                time=e["time"],
                kind=e["kind"],
                rank=int(e["rank"]) if e["rank"] >= 0 else None,
                node=e["node_id"] or None,
                gpu=int(e["gpu"]) if e["gpu"] >= 0 else None,
                message=e["message"],
                attrs=json.loads(e["attrs"] or "{}"),
            )
            for e in events
        ]
        series = self.q.scalar_steps(run_id, max(0, from_step - 20), to_step)
        if series.num_rows:
            names = series.column("name").to_pylist()
            steps = series.column("step").to_numpy()
            values = series.column("v").to_numpy()
            times = series.column("t").to_numpy()
            # Rows come ordered by name: each series is one slice, and the changes of all of
            # them are found in one pass (a mask and a call per name made the timeline of a
            # run with 10,000 metric names take minutes).
            cuts = [0, *(i for i in range(1, len(names)) if names[i] != names[i - 1]), len(names)]
            heads = [names[i] for i in cuts[:-1]]
            where = {n: (cuts[k], cuts[k + 1]) for k, n in enumerate(heads)}
            for ch in series_changes(heads, cuts, steps, values, since=from_step):
                lo, hi = where[ch.name]
                at = lo + int(np.searchsorted(steps[lo:hi], ch.step))
                items.append(
                    MetricChangeItem(
                        step=ch.step,
                        end_step=ch.end_step,
                        time=float(times[at]),
                        kind=ch.what,
                        metric=ch.name,
                        value=_json_num(ch.value),
                        previous=_json_num(ch.previous),
                        message=_describe(ch),
                    )
                )
        items.sort(key=lambda i: (i.time, i.step if i.step is not None else -1))
        return items


def _hardware(g: GpuHealth | None, h: NodeHealth | None) -> RankHardware | None:
    if g is None and h is None:
        return None
    return RankHardware(
        gpu_temp_max=_f(g.temp_max) if g else None,
        sm_clock_ratio_min=_f(g.clock_ratio_min) if g else None,
        throttle_reasons=g.throttle if g else None,
        power_max_w=_f(g.power_max) if g else None,
        ecc_correctable=_f(g.sbe_delta) if g else None,
        ecc_uncorrectable=_f(g.dbe_delta) if g else None,
        xids=list(g.xids) if g else [],
        nvlink_crc_errors=_f(g.nvlink_crc_delta) if g else None,
        pcie_replays=_f(g.pcie_replay_delta) if g else None,
        host_cpu_max=_f(h.cpu_max) if h else None,
        nic_errors_per_s=_f(h.nic_errors_per_s) if h else None,
        tcp_retransmits_per_s=_f(h.retransmits_per_s) if h else None,
        ib_errors_per_s=_f(h.ib_errors_per_s) if h else None,
        rdma_retries_per_s=_f(h.rdma_retries_per_s) if h else None,
    )


def _ms(x: Any) -> float | None:
    v = _f(x)
    return None if v is None else v * 1000.0


def _json_num(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


def _describe(ch: MetricChange) -> str:
    name, what, value, prev = ch.name, ch.what, ch.value, ch.previous
    if what == "nonfinite":
        return f"{name} {value}"
    if what == "changed":
        return f"{name} changed {prev:g} -> {value:g}"
    if what == "schedule":
        return f"{name} schedule: {prev:g} -> {value:g} over steps {ch.step}-{ch.end_step}"
    return f"{name} spiked to {value:g}"
