"""Healthy noise is calibrated against real PAI and Megatron recordings, not guessed."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fleetlens.sim import CALIBRATION, MemorySink, derive_calibration, load_scenario, run_scenario
from fleetlens.sim.rates import LLAMA3_INTERRUPTIONS

pytestmark = pytest.mark.unit

REAL = Path(__file__).resolve().parent / "data" / "real"


@pytest.fixture(scope="module")
def derived():  # type: ignore[no-untyped-def]
    return derive_calibration(REAL)


def test_recorded_constants_match_the_real_files(derived) -> None:  # type: ignore[no-untyped-def]
    for key, value in CALIBRATION.as_dict().items():
        np.testing.assert_allclose(getattr(derived, key), value, rtol=0.005, err_msg=key)


def test_healthy_job_reproduces_the_real_noise(derived) -> None:  # type: ignore[no-untyped-def]
    scn = load_scenario("demo")
    scn = replace(scn, faults=(), job=replace(scn.job, steps=600, checkpoint_every=10_000))
    sink = MemorySink()
    run_scenario(scn, sink=sink, seed=3)
    world = scn.world_size
    step = sink.column("step", "step")
    order = np.lexsort((sink.column("step", "rank"), step))
    comp = sum(sink.column("step", c) for c in ("forward", "backward", "optimizer"))[order]
    comp = comp.reshape(-1, world)
    # within a rank, step to step: PAI's stable job (job_2) within-worker CoV
    within = np.median(comp.std(axis=0) / comp.mean(axis=0))
    assert within == pytest.approx(derived.rank_cov, rel=0.15)
    # the job's step time (slowest rank): between Megatron H100 and BigScience V100 runs
    job = sink.column("step", "duration")[order].reshape(-1, world).max(axis=1)
    robust = np.median(np.abs(job - np.median(job))) * 1.4826 / np.median(job)
    assert derived.megatron_h100_job_cov * 0.7 < robust < max(derived.bigscience_job_cov)


def test_llama3_mix_matches_the_published_table() -> None:
    path = REAL / "failure_statistics" / "llama3_405b_unexpected_interruptions.csv"
    with open(path, newline="") as fh:
        table = {r["component"]: int(r["interruption_count"]) for r in csv.DictReader(fh)}
    assert {k: v[0] for k, v in LLAMA3_INTERRUPTIONS.items()} == table
    assert sum(table.values()) == 419
