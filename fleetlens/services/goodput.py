"""Goodput reads over one tenant's telemetry: a run's breakdown and factors, a pool's schedule.

The rank -> step aggregation is the store's (:mod:`fleetlens.store.goodput_queries`: the
``steps_by_step`` rollup, merged per step and attempt in the engine); what comes back is one
row per step execution, which the pure functions in :mod:`fleetlens.analysis` turn into the
breakdown and the factors. Per execution it reads the slowest and the mean rank's compute (the
straggler line is their difference) and the longest input wait of any rank (the data-stall
line): the definitions the simulator's ground truth shares (docs/goodput.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from ..analysis.breakdown import Breakdown, Event, StepArrays, breakdown
from ..analysis.flops import accelerator, dense_flops_per_token, dtype_name, mbu, mfu
from ..analysis.goodput import Factors, factors_from_breakdown
from ..analysis.scheduling import PoolCapacity, SchedulingResult, scheduling_goodput
from ..errors import ConfigError, UnknownName
from ..store.goodput_queries import GoodputInputQueries
from ..store.reader import TenantReader
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore
from .runs_types import RunSummary

__all__ = [
    "GoodputQueries",
    "GoodputWindow",
    "ProgramFigures",
    "ProgramSpec",
    "goodput_window",
    "program_spec",
    "summary_mfu",
    "window_mfu",
]


class ProgramSpec:
    """What program goodput needs: model FLOPs per token (or per step), devices, peak rate;
    ``missing`` says why MFU cannot be computed (None when it can)."""

    def __init__(
        self,
        flops_per_token: float | None = None,
        flops_per_step: float | None = None,
        peak_flops: float | None = None,
        devices: int | None = None,
        hardware_ratio: float | None = None,
        *,
        accelerator: str | None = None,
        dtype: str | None = None,
        bytes_per_step: float | None = None,
        peak_bytes_per_s: float | None = None,
        missing: str | None = None,
    ) -> None:
        self.flops_per_token = flops_per_token
        self.flops_per_step = flops_per_step
        self.peak_flops = peak_flops
        self.devices = devices
        self.hardware_ratio = hardware_ratio
        self.accelerator = accelerator
        self.dtype = dtype
        self.bytes_per_step = bytes_per_step
        self.peak_bytes_per_s = peak_bytes_per_s
        self.missing = missing


def program_spec(
    config: dict[str, Any],
    *,
    accelerator_name: str | None = None,
    dtype: str | None = None,
    strict: bool = False,
) -> ProgramSpec:
    """Read a run's config: ``flops_per_step`` or ``flops_per_token`` or ``n_params`` (with
    optional ``n_layers``, ``d_model``, ``seq_len``), ``accelerator`` and ``dtype`` (or
    ``peak_flops``), ``devices`` (else the ranks seen), ``recompute`` (for HFU),
    ``bytes_per_step`` (weights and KV cache a step must move, for MBU).

    ``accelerator_name`` and ``dtype`` override the config's. The accelerator is resolved by
    :func:`fleetlens.analysis.flops.accelerator`'s forgiving match; an unknown one (or a dtype
    the table lacks) raises :class:`UnknownName` when ``strict``, else leaves MFU out with the
    reason in ``missing``."""

    def num(key: str) -> float | None:
        v = config.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    fpt = num("flops_per_token")
    if fpt is None and num("n_params"):
        fpt = dense_flops_per_token(
            num("n_params") or 0.0,
            int(num("n_layers") or 0),
            int(num("d_model") or 0),
            int(num("seq_len") or 0),
        )
    problems = []
    if fpt is None and num("flops_per_step") is None:
        problems.append("the run config has no n_params, flops_per_token or flops_per_step")
    peak = num("peak_flops")
    peak_bytes = None
    acc_name = None
    name = accelerator_name if accelerator_name is not None else config.get("accelerator")
    dt = str(dtype if dtype is not None else config.get("dtype", "bf16"))
    if name is not None and (peak is None or accelerator_name is not None):
        try:
            acc = accelerator(str(name))
            acc_name = acc.name
            peak = acc.peak_flops(dt)
            peak_bytes = acc.peak_bytes_per_s
        except UnknownName as exc:
            if strict:
                raise
            peak = None
            problems.append(str(exc))
    elif peak is None:
        problems.append("the run config names no accelerator (or peak_flops)")
    ratio = None
    rc = config.get("recompute")
    if rc == "full":
        ratio = 4.0 / 3.0
    dev = num("devices")
    return ProgramSpec(
        fpt,
        num("flops_per_step"),
        peak,
        int(dev) if dev else None,
        ratio,
        accelerator=acc_name,
        dtype=dtype_name(dt),
        bytes_per_step=num("bytes_per_step"),
        peak_bytes_per_s=peak_bytes,
        missing="; ".join(problems) or None,
    )


def window_mfu(
    spec: ProgramSpec, tokens_per_s: float | None, step_s: float | None, ranks: float | None
) -> float | None:
    """MFU over a window of steps from its speed: model FLOPs per second over the devices'
    peak (per token at the window's tokens/s, or per step at its step time)."""
    devices = spec.devices or ranks
    if not (spec.peak_flops and devices):
        return None
    if spec.flops_per_token and tokens_per_s:
        return float(mfu(spec.flops_per_token * tokens_per_s, 1.0, int(devices), spec.peak_flops))
    if spec.flops_per_step and step_s:
        return float(mfu(spec.flops_per_step, step_s, int(devices), spec.peak_flops))
    return None


def summary_mfu(config: dict[str, Any], summary: RunSummary) -> tuple[float | None, ProgramSpec]:
    """MFU over a run summary's window (:func:`fleetlens.services.runs.summarize`: its
    tokens/s, median step time and world size), with the spec it was computed from."""
    spec = program_spec(config)
    step_ms = summary.step_time_ms
    value = window_mfu(
        spec,
        summary.tokens_per_second,
        step_ms / 1000.0 if step_ms else None,
        summary.world_size,
    )
    return value, spec


def _by_run(table: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    """The rows of each run of a table ordered by ``run_id``, without that column."""
    if not table.num_rows:
        return
    ids = np.asarray(table.column("run_id").to_pylist(), dtype=object)
    cuts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    rest = table.drop_columns(["run_id"])
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(ids)], strict=True):
        yield str(ids[lo]), rest.slice(int(lo), int(hi - lo))


def _executions(table: pa.Table | None) -> tuple[StepArrays, dict[str, float]]:
    """Step executions (a row per step and attempt) as arrays, with tokens per step and ranks;
    none for no table."""
    if table is None or table.num_rows == 0:
        return StepArrays.empty(), {"tokens": 0.0, "ranks": 0.0}
    col = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
    arrays = StepArrays(
        step=col["step"].astype(np.int64),
        job_id=np.asarray(col["job_id"], dtype=object),
        start=col["x_start"].astype(np.float64),
        end=col["x_end"].astype(np.float64),
        max_compute=col["x_max"].astype(np.float64),
        mean_compute=col["x_mean"].astype(np.float64),
        data_wait=np.nan_to_num(col["x_wait"].astype(np.float64), nan=0.0),
    )
    extra = {
        "tokens_per_step": float(np.mean(col["x_tokens"])),
        "ranks": float(col["x_ranks"][np.argmax(col["x_start"])]),
    }
    return arrays, extra


@dataclass(frozen=True, slots=True)
class ProgramFigures:
    """What a run's program goodput was computed from (:meth:`GoodputQueries.run_goodput`): its
    devices, the retained steps' model FLOPs (None: the config names none) and the basis,
    ``mfu_retained_steps`` (MFU of the retained steps) or ``straggler_bound``."""

    devices: int | None
    retained_flops: float | None
    program_basis: str


class GoodputQueries:
    def __init__(self, telemetry: TelemetryStore, tenant: str | Scope) -> None:
        self.q = GoodputInputQueries(TenantReader(telemetry, tenant))

    def step_executions(
        self, run_id: str, t0: float | None = None, t1: float | None = None
    ) -> tuple[StepArrays, dict[str, float]]:
        """One row per (step, attempt), merged from the rollup, with the steps' input wait."""
        return _executions(self.q.step_executions(run_id, t0, t1))

    def runs_inputs(
        self, run_ids: list[str], t0: float, t1: float, chunk: int = 500
    ) -> dict[str, tuple[tuple[StepArrays, dict[str, float]], list[Event]]]:
        """:meth:`step_executions` over ``[t0, t1]`` and :meth:`events` of each of many runs,
        read a few hundred runs a statement."""
        out: dict[str, tuple[tuple[StepArrays, dict[str, float]], list[Event]]] = {}
        for i in range(0, len(run_ids), chunk):
            ex, ev = self.q.runs_inputs(run_ids[i : i + chunk], t0, t1)
            steps = dict(_by_run(ex))
            events = {rid: [Event.from_row(r) for r in t.to_pylist()] for rid, t in _by_run(ev)}
            for rid in run_ids[i : i + chunk]:
                out[rid] = (_executions(steps.get(rid)), events.get(rid, []))
        return out

    def events(self, run_id: str) -> list[Event]:
        return [Event.from_row(r) for r in self.q.events(run_id).to_pylist()]

    def run_goodput(
        self,
        run_id: str,
        spec: ProgramSpec | None = None,
        window: tuple[float, float] | None = None,
        scheduling: float = 1.0,
        executions: tuple[StepArrays, dict[str, float]] | None = None,
        held_only: bool = False,
        events: list[Event] | None = None,
    ) -> tuple[Breakdown, Factors, ProgramFigures]:
        """The run's breakdown and factors (program goodput = MFU over retained steps).

        ``executions`` are the whole run's step executions when the caller has read them
        already (the run page reads the rollup once for several figures; the fleet's series
        one window after another), ``events`` its events likewise. ``held_only``: the window cut
        to the run's own span (:func:`~fleetlens.analysis.breakdown.breakdown`)."""
        if executions is not None:
            steps, extra = executions
        else:
            pad = None if window is None else (window[0], window[1])
            steps, extra = self.step_executions(run_id, *(pad or (None, None)))
        evs = self.events(run_id) if events is None else events
        bd = breakdown(steps, evs, window=window, held_only=held_only)
        spec = spec or ProgramSpec()
        devices = spec.devices or int(extra.get("ranks", 0)) or None
        flops = None
        if spec.flops_per_step is not None:
            flops = spec.flops_per_step * bd.retained_steps
        elif spec.flops_per_token is not None:
            flops = spec.flops_per_token * extra.get("tokens_per_step", 0.0) * bd.retained_steps
        hw = flops * spec.hardware_ratio if flops is not None and spec.hardware_ratio else None
        f = factors_from_breakdown(
            bd,
            flops=flops,
            devices=devices,
            peak_flops=spec.peak_flops,
            hardware_flops=hw,
            scheduling=scheduling,
        )
        if spec.bytes_per_step and spec.peak_bytes_per_s and devices and bd.retained_step_s > 0:
            moved = spec.bytes_per_step * bd.retained_steps
            f = replace(f, mbu=mbu(moved, bd.retained_step_s, devices, spec.peak_bytes_per_s))
        program_basis = (
            "mfu_retained_steps" if flops is not None and spec.peak_flops else ("straggler_bound")
        )
        return bd, f, ProgramFigures(devices, flops, program_basis)

    def pool_scheduling(self, pool: str, t0: float, t1: float) -> SchedulingResult:
        """Scheduling goodput of ``pool`` over [t0, t1] from ``sched_alloc`` and ``sched_pool``."""
        alloc = self.q.allocations(pool, t0, t1)
        cap = self.q.capacity(pool)

        def arr(table: Any, name: str) -> np.ndarray[Any, Any]:
            return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)

        if cap.num_rows:
            capacity = PoolCapacity(
                arr(cap, "time"), arr(cap, "capacity_gpus"), arr(cap, "in_service_gpus")
            )
        else:
            capacity = PoolCapacity.constant(0.0)
        return scheduling_goodput(
            arr(alloc, "gpus"),
            arr(alloc, "submit"),
            arr(alloc, "start"),
            arr(alloc, "gang_complete"),
            arr(alloc, "end"),
            capacity,
            window=(t0, t1),
        )

    def pools(self) -> list[str]:
        return self.q.pools()

    def pool_jobs(self, pool: str) -> tuple[set[str], set[str]]:
        """The run ids and scheduler job ids the pool's allocations name."""
        return self.q.pool_jobs(pool)

    def time_span(self, pool: str | None) -> tuple[float, float] | None:
        """The first and last time the pool's records (allocations, capacity) speak of; None
        without any. A pool known only from capacity snapshots (sinfo) has a span too."""
        return self.q.time_span(pool)


@dataclass(frozen=True, slots=True)
class GoodputWindow:
    """A run's goodput over a window of time (:func:`goodput_window`): [start, end] UNIX seconds
    of ``window_s`` at most; ``unaccounted_share`` NaN for an empty window."""

    run_id: str
    start: float
    end: float
    window_s: float
    runtime_goodput: float
    program_goodput_bound: float
    job_product: float
    unaccounted_share: float
    instrumentation_hole: bool
    seconds: dict[str, float]  # per breakdown category


def goodput_window(
    telemetry: TelemetryStore,
    tenant: str | Scope,
    run_id: str,
    window_s: float,
    now: float,
    started: float | None = None,
) -> GoodputWindow:
    """A run's goodput over the last ``window_s`` seconds before ``now``, for alerts and series.

    Runtime goodput over the window's held time; program goodput's straggler-only bound (MFU
    needs the run's FLOPs, which the caller may add). Steps after the window's last checkpoint
    count as retained until a later attempt replays them. ``started``: the run's first record;
    the window begins no earlier (a run younger than the window did not hold its GPUs before it
    began: it read 0% goodput for its first minutes). The window ends at ``now`` whatever the
    run's last step: a hang's time after it is held.
    """
    if window_s <= 0:
        raise ConfigError(f"window_s is {window_s}; a window has a positive length")
    t0 = now - window_s if started is None else min(now, max(now - window_s, started))
    bd, f, _meta = GoodputQueries(telemetry, tenant).run_goodput(run_id, window=(t0, now))
    return GoodputWindow(
        run_id=run_id,
        start=t0,
        end=now,
        window_s=window_s,
        runtime_goodput=bd.runtime_goodput,
        program_goodput_bound=f.program,
        job_product=f.job_product,
        unaccounted_share=bd.seconds["unaccounted"] / bd.wall_s if bd.wall_s > 0 else math.nan,
        instrumentation_hole=bd.instrumentation_hole,
        seconds=bd.seconds,
    )
