"""The worked examples of the goodput chapter (seed 003), reproduced by the analysis functions."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fleetlens.analysis.advisors import (
    RuntimeModel,
    ceiling_gains,
    chargeback_per_useful_hour,
    checkpoint_waste,
    cost_per_useful_hour,
    judge_change,
    marginal_values,
    predicted_terms,
    young_daly,
)
from fleetlens.analysis.breakdown import Event, StepArrays, breakdown
from fleetlens.analysis.flops import (
    ACCELERATORS,
    accelerator,
    dense_flops_per_token,
    hardware_flops_per_token,
    mbu,
    mfu,
    moe_flops_per_token,
)
from fleetlens.analysis.goodput import Factors, factors_from_breakdown, loss_shares
from fleetlens.errors import ConfigError
from fleetlens.importers.chronicle import load_chronicle, replay

pytestmark = pytest.mark.unit

HOUR, DAY = 3600.0, 86400.0
DATA = Path(__file__).parent / "data"


def running_example_runtime() -> tuple[float, dict[str, float]]:
    """Napkin Math 9.3: the 128-GPU Llama 2 70B job's five runtime terms over a week."""
    tau, _ = young_daly(9.8, 302 * HOUR)
    terms = predicted_terms(
        RuntimeModel(
            held_s=7 * DAY,
            startup_s=5.2 * 60,
            data_stall_ratio=0.05 / 0.65,
            checkpoint_write_s=9.8,
            checkpoint_interval_s=tau,
            mtbf_s=302 * HOUR,
            recovery_s=6.2 * 60,
            preemptions_per_s=1 / DAY,
            preemption_tax_s=20.2 * 60,
        )
    )
    return 1.0 - sum(terms.values()), terms


def test_llama3_405b_split_of_held_capacity() -> None:
    s = loss_shares(1.0, 0.90, 0.41)
    assert s.scheduling == 0.0
    assert s.runtime == pytest.approx(0.10)
    assert round(s.program, 2) == 0.53
    assert round(s.useful, 2) == 0.37
    assert s.scheduling + s.runtime + s.program + s.useful == pytest.approx(1.0)


def test_fleet_mfu_of_the_128_gpu_step() -> None:
    # 14.9 PFLOP per 245 ms step on 128 GPUs at 989 TFLOP/s: 48 %.
    assert mfu(14.9e15, 0.245, 128, 989e12) == pytest.approx(0.48, abs=0.005)
    h100 = accelerator("h100-sxm")
    assert h100.peak_flops("bf16") == pytest.approx(989.5e12)
    assert mfu(14.9e15, 0.245, 128, h100.peak_flops()) == pytest.approx(0.48, abs=0.005)
    # Single-node baseline 180 ms: 65 %, and the scaling efficiency 180/245 = 0.74.
    assert mfu(14.9e15 / 16, 0.180, 8, 989e12) == pytest.approx(0.65, abs=0.01)


def test_young_daly_77_minutes_and_21_with_preemptions() -> None:
    tau, m = young_daly(9.8, 302 * HOUR)
    assert tau / 60 == pytest.approx(77, abs=0.5)
    assert m == 302 * HOUR
    tau_p, m_p = young_daly(9.8, 302 * HOUR, preemptions_per_s=1 / DAY)
    assert tau_p / 60 == pytest.approx(21, abs=0.5)
    assert m_p < DAY
    # Waste at the optimum: writes and expected rework are equal, 0.2 % + 0.2 %.
    w = checkpoint_waste(tau, 9.8, 302 * HOUR)
    assert w == pytest.approx(0.0042, abs=0.0002)
    # Keeping the hardware-only interval while preempted daily wastes more than re-tuning it.
    assert checkpoint_waste(tau, 9.8, m_p) > checkpoint_waste(tau_p, 9.8, m_p)


def test_five_runtime_terms_of_the_128_gpu_week() -> None:
    r, t = running_example_runtime()
    assert t["startup"] == pytest.approx(0.0005, abs=0.0001)
    assert t["data_stall"] == pytest.approx(0.077, abs=0.001)
    assert t["checkpoint"] == pytest.approx(0.004, abs=0.0005)
    assert t["recovery"] == pytest.approx(0.0003, abs=0.0001)
    assert t["preemption"] == pytest.approx(0.014, abs=0.0005)
    assert r == pytest.approx(0.90, abs=0.01)
    # Twelve preemptions a day would cost 16.8 % of held time.
    twelve_a_day = 12 * 20.2 * 60 / DAY
    assert twelve_a_day == pytest.approx(0.168, abs=0.001)


def test_running_example_products_shares_values_and_cost() -> None:
    r, _ = running_example_runtime()
    p = mfu(14.9e15, 0.245, 128, 989e12)
    f = Factors(runtime=r, program=p, scheduling=0.65)
    assert round(f.job_product, 2) == 0.43
    assert round(f.mpg, 2) == 0.28
    shares = f.shares
    assert (round(shares.scheduling, 2), round(shares.runtime, 2), round(shares.program, 2)) == (
        0.35,
        0.06,
        0.31,
    )
    mv = marginal_values(f)
    assert (round(mv["scheduling"], 2), round(mv["runtime"], 2), round(mv["program"], 2)) == (
        0.43,
        0.31,
        0.59,
    )
    assert cost_per_useful_hour(2.0, f) == pytest.approx(7.09, abs=0.02)
    assert cost_per_useful_hour(2.0, f) / 2.0 == pytest.approx(3.5, abs=0.05)
    assert chargeback_per_useful_hour(2.0, f) / 2.0 == pytest.approx(2.3, abs=0.05)
    gains = ceiling_gains(f, {"scheduling": 0.80, "runtime": 0.98, "program": 0.65})
    assert round(gains["scheduling"]["mpg"], 2) == 0.35
    assert round(gains["runtime"]["mpg"], 2) == 0.31
    assert round(gains["program"]["mpg"], 2) == 0.38
    assert gains["program"]["gain"] == pytest.approx(0.35, abs=0.01)
    assert max(gains, key=lambda k: gains[k]["gain"]) == "program"


def test_a_change_is_judged_by_the_product_of_ratios() -> None:
    before = Factors(runtime=0.90, program=0.48, scheduling=0.65)
    # The program at its ceiling pays even if it costs up to 26 % of runtime goodput.
    ok = judge_change(before, Factors(runtime=0.90 * 0.75, program=0.65, scheduling=0.65))
    bad = judge_change(before, Factors(runtime=0.90 * 0.72, program=0.65, scheduling=0.65))
    assert ok["improves"] and not bad["improves"]
    assert ok["product"] == pytest.approx(0.75 * 0.65 / 0.48)
    # Removing every runtime loss raises runtime goodput by at most 11 %.
    full = judge_change(before, Factors(runtime=1.0, program=0.48, scheduling=0.65))
    assert full["runtime"] == pytest.approx(1.11, abs=0.005)


def test_flops_calculators() -> None:
    # 6N plus 12 L d S; MoE counts the active parameters only.
    assert dense_flops_per_token(70e9) == 6 * 70e9
    assert dense_flops_per_token(70e9, 80, 8192, 4096) == 6 * 70e9 + 12 * 80 * 8192 * 4096
    assert moe_flops_per_token(37e9) == dense_flops_per_token(37e9)
    assert hardware_flops_per_token(6.0, "full") == pytest.approx(8.0)
    assert hardware_flops_per_token(6.0, "0.5") == pytest.approx(7.0)
    with pytest.raises(ValueError, match="recompute"):
        hardware_flops_per_token(6.0, "most")
    # Decode of a 70B fp16 model on 8 H100 at 5.2 ms per token: weights streamed at MBU ~ 1.
    assert mbu(140e9, 5.2e-3, 8, 3.35e12) == pytest.approx(1.0, abs=0.01)
    for acc in ACCELERATORS.values():
        assert acc.source and acc.hbm_tb_s > 0 and acc.tflops
    assert accelerator("MI300X").peak_flops("bf16") > accelerator("H100-SXM").peak_flops("bf16")
    with pytest.raises(ConfigError, match="known"):
        accelerator("tpu-v9")


def test_bloom_176b_chronicle_replayed() -> None:
    c = load_chronicle(DATA / "bloom_tr11_incidents.json")
    steps, events = replay(c)
    bd = breakdown(steps, events)
    h = {k: v / HOUR for k, v in bd.seconds.items()}
    assert sum(bd.seconds.values()) == pytest.approx(bd.wall_s)
    assert bd.wall_s / DAY == pytest.approx(108.18, abs=0.01)
    assert h["hang"] == pytest.approx(35.0)  # 18 + 6 + 11 h, lines 317, 471, 577
    # Lines 94 and 225, rounded down to whole 105 s steps.
    assert h["rework"] == pytest.approx(7.3 + 8 * 1.5, abs=0.15)
    assert h["maintenance"] == pytest.approx(3.5)
    assert h["evaluation"] / (bd.wall_s / HOUR) == pytest.approx(0.0066, abs=0.0005)  # ~0.7 %
    assert bd.seconds["unaccounted"] == 0.0
    m = c.meta["model"]
    per_step = dense_flops_per_token(m["n_params"], m["n_layers"], m["d_model"], m["seq_len"])
    per_step *= m["global_batch"] * m["seq_len"]
    peak = accelerator(m["accelerator"]).peak_flops(m["dtype"])
    f = factors_from_breakdown(
        bd,
        flops=per_step * bd.retained_steps,
        devices=m["gpus"],
        peak_flops=peak,
        hardware_flops=per_step * 4 / 3 * bd.retained_steps,
    )
    assert f.runtime == pytest.approx(0.966, abs=0.002)
    assert f.program == pytest.approx(0.360, abs=0.002)
    # Megatron's reported 149 TFLOPs counts the recomputed forward: HFU ~ 0.48.
    assert f.hfu == pytest.approx(m["reported_tflops_per_gpu"] * 1e12 / peak, abs=0.01)
    assert f.job_product == pytest.approx(0.348, abs=0.003)
    assert not math.isnan(f.mpg)


def _steps_with_one_held_open(hold_s: float, data_wait_s: float = 0.0) -> StepArrays:
    """200 steps of 0.1 s; step 100 held open ``hold_s`` more (a rank stopped mid-step, its
    peers waiting in the all-reduce), of which ``data_wait_s`` was a rank waiting for input."""
    walls = np.full(200, 0.1)
    walls[100] += hold_s
    start = np.concatenate([[1000.0], 1000.0 + np.cumsum(walls)[:-1]])
    wait = np.zeros(200)
    wait[100] = data_wait_s
    return StepArrays(
        np.arange(200),
        np.full(200, "j", dtype=object),
        start,
        start + walls,
        walls.copy(),
        walls.copy(),
        wait,
    )


def test_a_step_held_open_by_a_hang_is_charged_to_hang_not_work() -> None:
    events = [Event(999.0, "job_start", "j"), Event(1170.1, "finish", "j")]
    bd = breakdown(_steps_with_one_held_open(150.0), events)
    assert bd.seconds["hang"] == pytest.approx(150.0, abs=1e-6)
    assert bd.seconds["productive"] == pytest.approx(20.0, abs=1e-6)
    assert sum(bd.seconds.values()) == pytest.approx(bd.wall_s, abs=1e-6)
    # Below the hang rule's threshold (60 s floor) a long step is not a hang...
    assert breakdown(_steps_with_one_held_open(30.0), events).seconds["hang"] == 0.0
    # ...and a step held by its input is a data stall, not a hang.
    stall = breakdown(_steps_with_one_held_open(150.0, data_wait_s=150.0), events)
    assert stall.seconds["data_stall"] == pytest.approx(150.0, abs=1e-6)
    assert stall.seconds["hang"] == 0.0
