"""Properties of the breakdown over random timelines: it sums, charges nothing twice, and its
factors telescope."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetlens.analysis.breakdown import CATEGORIES, FACTOR_OF, Event, StepArrays, breakdown
from fleetlens.analysis.goodput import Factors, factors_from_breakdown, telescoped

pytestmark = pytest.mark.unit

attempt = st.fixed_dictionaries(
    {
        "gap": st.floats(0, 50),
        "startup": st.floats(0, 30),
        "job_start": st.booleans(),
        "steps": st.integers(0, 25),
        "dur": st.floats(0.5, 20),
        "straggle": st.floats(0, 3),
        "wait": st.floats(0, 2),
        "idle": st.floats(0, 5),
        "ckpt_every": st.integers(1, 10),
        "ckpt_s": st.floats(0, 15),
        "tail": st.floats(0, 40),
        "cause": st.sampled_from(["failure", "preemption", "maintenance", "hang", "exception"]),
        "rewind": st.integers(0, 10),
        "explicit": st.lists(st.tuples(st.floats(0, 1), st.floats(0, 30)), max_size=2),
    }
)


def build(attempts: list[dict[str, Any]]) -> tuple[StepArrays, list[Event]]:
    rows: list[tuple[int, str, float, float, float, float, float]] = []
    events: list[Event] = []
    t, step = 1000.0, 0
    for k, a in enumerate(attempts):
        job = f"a{k}"
        t += a["gap"]
        if a["job_start"] or k == 0:
            events.append(Event(t, "job_start", job))
        t += a["startup"]
        first = t
        for i in range(a["steps"]):
            d = a["dur"] + a["straggle"]
            rows.append((step, job, t, t + d, d, a["dur"], a["wait"] if a["wait"] < d else 0.0))
            t += d + a["idle"] * (i % 3 == 0)
            step += 1
            if step % a["ckpt_every"] == 0 and a["ckpt_s"] > 0:
                events.append(Event(t, "checkpoint_begin", job, step))
                t += a["ckpt_s"]
                events.append(Event(t, "checkpoint_end", job, step))
        for frac, dur in a["explicit"]:
            at = first + frac * (t - first)
            events.append(Event(at, "custom", job, -1, {"category": "evaluation", "duration": dur}))
        if a["cause"] == "hang":
            events.append(Event(t + a["tail"] / 2, "hang", job))
        t += a["tail"]
        last = k == len(attempts) - 1
        events.append(Event(t, "finish" if last else a["cause"], job, step))
        step = max(0, step - a["rewind"])
    if not rows:
        return StepArrays.empty(), events
    arr = np.array([r[2:] for r in rows], dtype=np.float64)
    steps = StepArrays(
        step=np.array([r[0] for r in rows], dtype=np.int64),
        job_id=np.array([r[1] for r in rows], dtype=object),
        start=arr[:, 0],
        end=arr[:, 1],
        max_compute=arr[:, 2],
        mean_compute=arr[:, 3],
        data_wait=arr[:, 4],
    )
    return steps, events


timelines = st.lists(attempt, min_size=1, max_size=5)


@settings(max_examples=150, deadline=None)
@given(timelines)
def test_breakdown_sums_to_wall_clock_and_factors_are_fractions(attempts: list[Any]) -> None:
    steps, events = build(attempts)
    bd = breakdown(steps, events)
    assert set(bd.seconds) == set(CATEGORIES) == set(FACTOR_OF)
    assert all(v >= -1e-9 for v in bd.seconds.values())
    assert sum(bd.seconds.values()) == pytest.approx(bd.wall_s, rel=1e-9, abs=1e-6)
    assert 0.0 <= bd.held_s <= bd.wall_s + 1e-9
    assert 0.0 <= bd.runtime_goodput <= 1.0
    f = factors_from_breakdown(bd)
    for v in (f.runtime, f.program, f.job_product, f.mpg):
        assert 0.0 <= v <= 1.0
    # Every step execution is charged once: to its retained lines or to rework.
    step_lines = sum(bd.seconds[c] for c in ("productive", "straggler", "data_stall", "rework"))
    assert step_lines <= bd.wall_s + 1e-6


@settings(max_examples=100, deadline=None)
@given(timelines, st.floats(0.05, 0.95))
def test_no_interval_is_charged_twice_across_a_split_window(
    attempts: list[Any], cut: float
) -> None:
    """Charging [t0, m] and [m, t1] separately gives the whole window's lines, line by line."""
    steps, events = build(attempts)
    whole = breakdown(steps, events)
    m = whole.t0 + cut * whole.wall_s
    left = breakdown(steps, events, window=(whole.t0, m))
    right = breakdown(steps, events, window=(m, whole.t1))
    for c in CATEGORIES:
        assert left.seconds[c] + right.seconds[c] == pytest.approx(
            whole.seconds[c], rel=1e-9, abs=1e-6
        )
    assert left.held_s + right.held_s == pytest.approx(whole.held_s, rel=1e-9, abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(timelines, st.floats(0.1, 1.0), st.floats(0.05, 1.0))
def test_product_equals_the_telescoped_ratio(
    attempts: list[Any], scheduling: float, mfu_share: float
) -> None:
    steps, events = build(attempts)
    bd = breakdown(steps, events)
    if bd.retained_step_s <= 0 or bd.held_s <= 0:
        return
    ideal = mfu_share * bd.productive_s  # ideal time <= productive time
    f = factors_from_breakdown(
        bd, flops=ideal * 1e12, devices=1, peak_flops=1e12, scheduling=scheduling
    )
    in_service = bd.held_s / scheduling
    assert f.mpg == pytest.approx(telescoped(ideal, bd.retained_step_s, bd.held_s, in_service))
    shares = f.shares
    total = shares.scheduling + shares.runtime + shares.program + shares.useful
    assert total == pytest.approx(1.0)


def test_factors_refuse_values_outside_zero_one() -> None:
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        Factors(runtime=1.2, program=0.5)
    with pytest.raises(ValueError, match="nest"):
        telescoped(2.0, 1.0, 3.0, 4.0)


def test_a_hole_in_the_record_is_reported_not_hidden() -> None:
    steps, events = build(
        [
            {
                "gap": 0, "startup": 0, "job_start": True, "steps": 10, "dur": 10, "straggle": 0,
                "wait": 0, "idle": 30, "ckpt_every": 100, "ckpt_s": 0, "tail": 0,
                "cause": "failure", "rewind": 0, "explicit": [],
            }
        ]
    )  # fmt: skip
    bd = breakdown(steps, events)
    assert bd.seconds["unaccounted"] == pytest.approx(4 * 30)
    assert bd.instrumentation_hole
    assert bd.instrumentation_hole is True


def test_known_losses_come_back() -> None:
    """Startup, rework, recovery (held and unheld), checkpoint and straggling, by hand."""
    rows = []
    t = 60.0
    for s in range(100):
        rows.append((s, "a0", t, t + 10, 10.0, 9.0))
        t += 10
        if s == 49:
            t += 20
    fail = t + 30
    t = fail + 150
    for s in range(50, 120):
        rows.append((s, "a1", t, t + 10, 10.0, 10.0))
        t += 10
    arr = np.array([r[2:] for r in rows], dtype=np.float64)
    steps = StepArrays(
        np.array([r[0] for r in rows]),
        np.array([r[1] for r in rows], dtype=object),
        arr[:, 0],
        arr[:, 1],
        arr[:, 2],
        arr[:, 3],
    )
    events = [
        Event(0, "job_start", "a0"),
        Event(560, "checkpoint_begin", "a0"),
        Event(580, "checkpoint_end", "a0"),
        Event(fail, "failure", "a0"),
        Event(fail + 100, "job_start", "a1"),
        Event(t, "finish", "a1"),
    ]
    bd = breakdown(steps, events)
    s = bd.seconds
    assert (s["startup"], s["checkpoint"], s["rework"], s["recovery"]) == (60, 20, 500, 180)
    assert (s["productive"], s["straggler"], s["unaccounted"]) == (1150, 50, 0)
    assert bd.unheld == {"recovery": 100}
    assert bd.held_s == bd.wall_s - 100
    assert bd.rework_by_cause["failure"] == 500
    assert bd.runtime_goodput == pytest.approx(1200 / (bd.wall_s - 100))
