"""A healthy job gets no false findings (issue 32 item 5).

Four real SDK runs (one per rank, in this process) report a DDP-like job to a real server: steps
of ~100 ms whose data phase takes ~3.5 ms, with the hiccups a busy host gives a real job (three
waits of ~45 ms in a row on one rank). Later a rank's loader genuinely stalls (40 ms per step
for 30 steps). Only the genuine stall is a finding; the hiccups, 1-2% of their block, are not.
Steps are recorded with their own timestamps (``Run.record_step``) so the job takes no time here.

Its learning rate follows nanoGPT's schedule (linear warmup, cosine decay: a new value every
step), halved by hand once; its batch size doubles twice. The timeline shows the schedule as
one entry (two: before and after the manual drop), and each discrete change as its own.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

import fleetlens
from fleetlens.analysis.nanstats import nanmedian, nanmin
from fleetlens.testing import Server, wait_until

pytestmark = pytest.mark.e2e

STEPS = 200
STEP_S = 0.1
HICCUP_RANK, HICCUP_STEPS = 1, (42, 43, 44)
STALL_RANK, STALL_STEPS = 2, range(120, 150)
WARMUP, LR_MAX, LR_MIN, LR_DROP = 20, 3e-4, 6e-5, 150
BATCH_DOUBLES = (50, 100)


def lr_at(step: int) -> float:
    """nanoGPT's get_lr, halved from LR_DROP on."""
    if step < WARMUP:
        lr = LR_MAX * (step + 1) / (WARMUP + 1)
    else:
        ratio = (step - WARMUP) / (STEPS - WARMUP)
        lr = LR_MIN + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR_MAX - LR_MIN)
    return lr * (0.5 if step >= LR_DROP else 1.0)


def play_healthy_job(server: Server, tmp_path: Path, run_id: str) -> None:
    """The job above; ``run.log`` also reports its loss and lr, for the timeline's tests."""
    runs = [
        fleetlens.init(project="p", run_id=run_id, rank=r, world_size=4, node_id="node-0",
                       gpu=r, server=server.url, spool_dir=str(tmp_path / f"spool-{r}"),
                       install_signal_handler=False)
        for r in range(4)
    ]  # fmt: skip
    rng = np.random.default_rng(7)
    t0 = time.time() - STEPS * STEP_S
    for step in range(STEPS):
        for r, run in enumerate(runs):
            data = 0.0035 * rng.uniform(0.8, 1.3)
            if r == HICCUP_RANK and step in HICCUP_STEPS:
                data = 0.045 * rng.uniform(0.95, 1.05)
            if r == STALL_RANK and step in STALL_STEPS:
                data = 0.04 * rng.uniform(0.95, 1.05)
            fwd, bwd, opt = (STEP_S * f * rng.uniform(0.9, 1.1) for f in (0.3, 0.55, 0.1))
            run.record_step(step, time=t0 + step * STEP_S, duration=data + fwd + bwd + opt,
                            phases={"data": data, "forward": fwd, "backward": bwd,
                                    "optimizer": opt}, tokens=4096)  # fmt: skip
            batch = 8 * 2 ** sum(step >= b for b in BATCH_DOUBLES)
            run.log(step, loss=4.0 * math.exp(-step / 100), lr=lr_at(step), batch_size=batch)
    for run in runs:
        run.finish()


def test_a_few_ms_of_input_wait_and_host_hiccups_are_no_data_stall(
    server: Server, tmp_path: Path
) -> None:
    play_healthy_job(server, tmp_path, "healthy")

    def stalls() -> list[dict] | None:  # type: ignore[type-arg]
        doc = server.get("/v1/runs/healthy/diagnosis")
        found = [f for f in doc["findings"] if f["diagnosis"] == "data_stall"]
        # The genuine stall's block comes after the hiccups' block: once it is judged, so is
        # the hiccups' (a finding of the same node is one finding, its window widened).
        return found if any(f["endStep"] >= STALL_STEPS[0] for f in found) else None

    found = wait_until(stalls, 60, what="the genuine data stall's finding")
    assert [(f["ranks"], f["startStep"]) for f in found] == [([STALL_RANK], STALL_STEPS[0])], found
    # Waits under a second are said in ms ("0.03s" read as no wait at all).
    assert " ms per step for data (typical 3." in found[0]["summary"], found[0]["summary"]
    # The job reports no comm phase: its transfer times are all NaN, which is no news to print.
    with open(server.log_path, errors="replace") as fh:
        log = fh.read()
    assert "Warning" not in log, log[-3000:]


def test_nan_reductions_answer_nan_for_a_slice_with_no_value_and_do_not_warn() -> None:
    a = np.array([[1.0, np.nan, 3.0], [np.nan] * 3, [np.inf, 2.0, np.nan]])
    np.testing.assert_array_equal(nanmedian(a, axis=1), [2.0, np.nan, np.inf])
    np.testing.assert_array_equal(nanmedian(a, axis=0), [np.inf, 2.0, 3.0])
    np.testing.assert_array_equal(nanmin(a, axis=1), [1.0, np.nan, 2.0])
    assert nanmedian(a) == 2.5 and np.isnan(nanmedian([np.nan, np.nan])) and np.isnan(nanmedian([]))
    assert nanmedian(np.empty((2, 0)), axis=1).shape == (2,)
    assert nanmin(np.empty((0, 3)), axis=1).shape == (0,)


def test_a_learning_rate_schedule_is_one_timeline_entry_and_a_manual_drop_its_own(
    server: Server, tmp_path: Path
) -> None:
    play_healthy_job(server, tmp_path, "scheduled")

    def metric_items(lo: int, hi: int) -> list[dict] | None:  # type: ignore[type-arg]
        doc = server.get(f"/v1/runs/scheduled/timeline?fromStep={lo}&toStep={hi}")
        return [i for i in doc["items"] if i["source"] == "metric"] or None

    def logged() -> list[dict] | None:  # type: ignore[type-arg]
        items = metric_items(0, STEPS - 1)
        return items if items and max(i.get("endStep") or i["step"] for i in items) == 199 else None

    items = wait_until(logged, 30, what="the run's scalars up to its last step")
    lr = [(i["kind"], i["step"], i.get("endStep")) for i in items if i["metric"] == "lr"]
    assert lr == [
        ("schedule", 1, LR_DROP - 1),  # warmup and cosine, one stretch
        ("changed", LR_DROP, None),  # the manual drop
        ("schedule", LR_DROP + 1, STEPS - 1),
    ], lr
    first = next(i for i in items if i["metric"] == "lr")
    assert first["message"] == (
        f"lr schedule: {lr_at(0):g} -> {lr_at(LR_DROP - 1):g} over steps 1-{LR_DROP - 1}"
    )
    batch = [(i["kind"], i["step"], i["value"]) for i in items if i["metric"] == "batch_size"]
    assert batch == [("changed", 50, 16.0), ("changed", 100, 32.0)], batch
    assert not [i for i in items if i["metric"] == "loss"]  # a smooth loss has no entry

    # A window inside a schedule shows the schedule from the window's first step.
    later = metric_items(170, 190) or []
    assert [(i["kind"], i["step"], i["endStep"]) for i in later] == [("schedule", 170, 190)]
    assert later[0]["previous"] == lr_at(169) and later[0]["value"] == lr_at(190), later
