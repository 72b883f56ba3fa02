"""Goodput read from the real embedded store: rollup + events in, breakdown and factors out."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

from fleetlens.analysis.breakdown import Event, StepArrays, breakdown
from fleetlens.services.goodput import (
    GoodputQueries,
    ProgramSpec,
    goodput_window,
    program_spec,
)
from fleetlens.store.chdb_store import ChdbStore

pytestmark = pytest.mark.unit

RANKS = 4


@pytest.fixture
def store(tmp_path) -> Iterator[ChdbStore]:  # type: ignore[no-untyped-def]
    s = ChdbStore(str(tmp_path / "telemetry"))
    try:
        yield s
    finally:
        s.close()


def _steps(store: ChdbStore, job: str, steps: range, t0: float, slow: float = 1.0) -> float:
    """Per-rank step rows through the ingest table (the rollup is fed by its view)."""
    n = len(steps)
    step = np.repeat(np.array(steps, dtype=np.int64), RANKS)
    rank = np.tile(np.arange(RANKS, dtype=np.int32), n)
    start = t0 + np.repeat(np.arange(n) * 10.0 * slow, RANKS)
    dur = np.where(rank == 2, 10.0 * slow, 10.0)
    wait = np.where(rank == 0, 1.0, 0.0)
    table = pa.table(
        {
            "step": step,
            "rank": rank,
            "time": start,
            "duration": dur,
            "data_wait": wait,
            "tokens": np.full(n * RANKS, 1000, dtype=np.int64),
        }
    )
    store.insert("step", table, {"tenant": "default", "run_id": "r1", "job_id": job}, f"s-{job}")
    return t0 + n * 10.0 * slow


def _events(store: ChdbStore, job: str, rows: list[tuple[float, str]]) -> None:
    table = pa.table({"time": [r[0] for r in rows], "kind": [r[1] for r in rows]})
    store.insert("event", table, {"tenant": "default", "run_id": "r1", "job_id": job}, f"e-{job}")


def test_run_goodput_from_the_store_matches_the_pure_breakdown(store: ChdbStore) -> None:
    _events(store, "a0", [(0.0, "job_start")])
    end0 = _steps(store, "a0", range(0, 100), 60.0, slow=1.1)
    _events(store, "a0", [(end0 + 30, "failure")])
    _events(store, "a1", [(end0 + 60, "job_start")])
    end1 = _steps(store, "a1", range(50, 150), end0 + 120)
    _events(store, "a1", [(end1, "finish")])
    # Another tenant's run of the same name is invisible.
    store.insert(
        "event",
        pa.table({"time": [5.0], "kind": ["failure"]}),
        {"tenant": "other", "run_id": "r1", "job_id": "a0"},
        "x",
    )
    q = GoodputQueries(store, "default")
    spec = ProgramSpec(flops_per_token=1e9, peak_flops=1e12, devices=RANKS)
    bd, f, meta = q.run_goodput("r1", spec)
    s = bd.seconds
    assert sum(s.values()) == pytest.approx(bd.wall_s)
    assert s["startup"] == pytest.approx(60.0)
    assert s["rework"] == pytest.approx(50 * 11.0, rel=1e-6)  # steps 50-99 of a0, slowest rank
    assert s["recovery"] == pytest.approx(30 + 30 + 60)
    assert s["data_stall"] == pytest.approx(150 * 1.0)  # rank 0's wait, every retained step
    assert s["unaccounted"] == pytest.approx(0.0, abs=1e-6)
    assert bd.attempts == 2 and bd.interruptions == {"recovery": 1}
    # MFU over the retained steps only: 150 steps x 4 ranks x 1000 tokens x 1 GFLOP.
    assert meta.program_basis == "mfu_retained_steps"
    assert f.program == pytest.approx(150 * 4000 * 1e9 / (bd.retained_step_s * RANKS * 1e12))
    # The same numbers as the pure function on the same rows.
    steps, _ = q.step_executions("r1")
    assert len(steps.step) == 200
    again = breakdown(steps, q.events("r1"))
    assert again.seconds == bd.seconds


def test_goodput_window_and_config_spec(store: ChdbStore) -> None:
    _events(store, "a0", [(0.0, "job_start")])
    end = _steps(store, "a0", range(0, 360), 0.0)
    w = goodput_window(store, "default", "r1", 600.0, end)
    assert w.window_s == 600.0
    assert w.runtime_goodput == pytest.approx(0.9)  # 1 s input wait per 10 s step
    assert not w.instrumentation_hole
    # A window past the run's end is all unaccounted: the hole shows.
    late = goodput_window(store, "default", "r1", 600.0, end + 3600)
    assert late.instrumentation_hole
    # A run younger than the window: the window begins at its first record (it read about 0%
    # for a live job's first minutes, the time before it began counted as held).
    young = goodput_window(store, "default", "r1", 2 * end + 3600, end)
    assert young.runtime_goodput < 0.5
    started = goodput_window(store, "default", "r1", 2 * end + 3600, end, started=0.0)
    assert started.start == 0.0 and started.runtime_goodput == pytest.approx(0.9, abs=0.01)
    with pytest.raises(ValueError, match="positive"):
        goodput_window(store, "default", "r1", 0.0, end)
    spec = program_spec({"n_params": 7e9, "accelerator": "H100-SXM", "recompute": "full"})
    assert spec.flops_per_token == 6 * 7e9
    assert spec.peak_flops == pytest.approx(989.5e12)
    assert spec.hardware_ratio == pytest.approx(4 / 3)


def test_pure_breakdown_accepts_plain_events() -> None:
    steps = StepArrays(
        np.arange(3),
        np.array(["a"] * 3, dtype=object),
        np.array([0.0, 10.0, 20.0]),
        np.array([10.0, 20.0, 30.0]),
        np.full(3, 10.0),
        np.full(3, 10.0),
    )
    bd = breakdown(steps, [Event.from_row({"time": 30.0, "kind": "finish", "attrs": "{}"})])
    assert bd.seconds["productive"] == 30.0 and bd.wall_s == 30.0
