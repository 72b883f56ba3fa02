"""Importing real training logs (BigScience Megatron-DeepSpeed, Megatron-LM CI golden values)."""

from __future__ import annotations

import calendar
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fleetlens.analysis.compare import slow_episodes
from fleetlens.importers.hf_trainer import parse_trainer_state
from fleetlens.importers.lightning import read_lightning
from fleetlens.importers.megatron import parse_megatron_log, read_megatron
from fleetlens.importers.steplog import read_nemo, read_torchtitan
from fleetlens.testing import Server, step_batch, wait_until
from fleetlens.wire import TableBuilder, encode_batch

pytestmark = pytest.mark.unit

REAL = Path(__file__).resolve().parent / "data" / "real" / "training_logs"
BIG = REAL / "bigscience_megatron_deepspeed"
GOLDEN = (
    REAL / "megatron_lm_ci_golden_values" / "gpt3_15b_8t_release__golden_values_dev_dgx_h100.json"
)
# Constructed from Megatron-LM's documented line format (see the README beside it), not a real run.
STAMPED = (
    Path(__file__).resolve().parent
    / "data" / "constructed" / "megatron_lm_timestamped" / "megatron_lm_timestamped.log"
)  # fmt: skip


@pytest.fixture
def gserver(tmp_path: Path) -> Iterator[Server]:
    srv = Server(str(tmp_path / "data")).start()
    try:
        yield srv
    finally:
        srv.stop()


def test_bigscience_logs_give_iterations_timing_loss_lr_and_job_end() -> None:
    off = read_megatron(BIG / "meg_ds_3d_gpt2_perf_n16-ds-off.out")
    a = off.attempts[0]
    assert a.steps == list(range(1, 63))
    assert a.durations[0] == pytest.approx(144.9156) and a.durations[1] == pytest.approx(125.5368)
    assert a.scalars["lr"][1][:2] == [1.875e-05, 3.750e-05]
    assert a.scalars["loss"][1][0] == pytest.approx(12.44238)
    assert a.tokens[0] == 1024 * 1024  # global batch x sequence length, from the arguments
    assert off.config["tensor_model_parallel_size"] == 4
    assert off.config["pipeline_model_parallel_size"] == 16

    on = read_megatron(BIG / "meg_ds_3d_gpt2_perf_n16-ds-on.out")  # "lm-loss" spelling
    assert len(on.attempts[0].steps) == 49 and len(on.attempts[0].scalars["loss"][0]) == 49

    base = read_megatron(BIG / "meg_gpt2_base_n8_dp1_tp4_pp8-1809562.out")
    b = base.attempts[0]
    assert b.job_id == "1809562" and b.steps[-1] == 200 and len(b.scalars["lr"][0]) == 20
    assert b.scalars["skipped_iterations"][1][:2] == [10.0, 8.0]
    end = b.events[-1]
    assert end["kind"] == "preemption" and end["attrs"]["end"] == "cancelled"
    assert "--tensor-model-parallel-size 4" in base.launch_command

    perf = read_megatron(BIG / "meg_gpt2_perf_n16-1999618.out")
    end = perf.attempts[0].events[-1]
    assert end["kind"] == "preemption" and end["attrs"]["end"] == "time_limit"
    assert perf.attempts[0].steps == [1, 2, 3, 4]
    # The clock: the log's datetime stamps, and the job end after the last iteration.
    assert perf.attempts[0].start == pytest.approx(1622151768.0)  # 2021-05-27 21:42:48 UTC
    assert end["time"] == pytest.approx(1622152356.0)  # CANCELLED AT 21:52:36


def test_golden_values_slowdown_episode_is_found() -> None:
    run = read_megatron(GOLDEN)
    a = run.attempts[0]
    steps, durs = np.asarray(a.steps), np.asarray(a.durations)
    logged = steps % 100 == 0
    assert logged.sum() == 508 and run.clock == "synthetic"
    assert float(np.median(durs[logged])) == pytest.approx(1.435, abs=0.01)
    eps = slow_episodes(steps[logged], durs[logged])
    big = [e for e in eps if e.points >= 2]
    assert len(big) == 1
    assert (big[0].from_step, big[0].to_step) == (2100, 2300)
    assert big[0].median_seconds == pytest.approx(6.1, abs=0.2)
    assert len(a.scalars["loss"][0]) > 10_000


def test_restart_in_a_log_is_a_new_attempt() -> None:
    line = (
        " iteration {i:8d}/    1000 | consumed samples: {i} | elapsed time per iteration (ms):"
        " 1000.0 | learning rate: 1.0E-04 | lm loss: 5.0E+00 | loss scale: 1.0 |"
    )
    text = "\n".join(
        ["[after megatron is initialized] datetime: 2021-05-23 08:00:00"]
        + [line.format(i=i) for i in range(1, 6)]
        + ["[after megatron is initialized] datetime: 2021-05-23 09:00:00"]
        + [line.format(i=i) for i in range(4, 8)]
    )
    p = Path("/tmp") / "restart-123456.out"
    from fleetlens.importers.megatron import parse_megatron_log

    run = parse_megatron_log(text, str(p))
    assert [x.job_id for x in run.attempts] == ["123456", "123456.r1"]
    assert run.attempts[1].steps == [4, 5, 6, 7]
    assert any(e["kind"] == "restart" for e in run.attempts[1].events)


def test_lightning_and_hf_trainer(tmp_path: Path) -> None:
    csv = tmp_path / "metrics.csv"
    csv.write_text(
        "epoch,step,train_loss,val_loss,lr-AdamW,time\n"
        "0,0,5.0,,0.001,1000.0\n0,10,4.0,,0.001,1020.0\n0,10,,4.5,,\n0,20,3.5,,0.0005,1040.0\n"
    )
    lt = read_lightning(csv)
    a = lt.attempts[0]
    assert a.scalars["loss"] == ([0, 10, 20], [5.0, 4.0, 3.5])
    assert a.scalars["val_loss"] == ([10], [4.5]) and a.scalars["lr"][1][-1] == 0.0005
    assert a.steps[:2] == [0, 1] and a.durations[0] == pytest.approx(2.0) and a.start == 1000.0
    state = {
        "global_step": 30,
        "max_steps": 30,
        "train_batch_size": 8,
        "log_history": [
            {"step": 10, "loss": 2.0, "learning_rate": 5e-5, "grad_norm": 1.1, "epoch": 0.3},
            {"step": 20, "eval_loss": 2.2, "eval_runtime": 3.0, "epoch": 0.6},
            {"step": 30, "train_runtime": 60.0, "epoch": 1.0},
        ],
    }
    hf = parse_trainer_state(state)
    h = hf.attempts[0]
    assert h.scalars["loss"] == ([10], [2.0]) and h.scalars["val_loss"] == ([20], [2.2])
    assert "eval_runtime" not in h.scalars and len(h.steps) == 30
    assert h.durations[0] == pytest.approx(2.0) and hf.config["train_batch_size"] == 8


def _cli(server: Server, *args: str) -> dict:
    """The installed CLI, ``fleetlens ARGS --server URL --json``, as a user runs it."""
    out = subprocess.run(
        [sys.executable, "-m", "fleetlens", *args, "--server", server.url, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.e2e
def test_imported_runs_in_the_store(gserver: Server) -> None:
    """Import through the wire and the server: the run's timeline, its anomaly, its end."""
    from fleetlens.importers.runlog import batches

    run = read_megatron(GOLDEN)
    for _, body in batches(run, "gpt3-15b-ci"):
        assert gserver.post(body, encoding="gzip")[0] == 200
    for _, body in batches(read_megatron(BIG / "meg_gpt2_perf_n16-1999618.out"), "bs-perf"):
        assert gserver.post(body, encoding="gzip")[0] == 200
    info = gserver.get("/v1/runs/gpt3-15b-ci")
    assert info["steps"] == 50800
    lin = gserver.get("/v1/lineage/runs/gpt3-15b-ci")
    eps = [e for e in lin["infrastructure"]["slowEpisodes"] if e["toStep"] - e["fromStep"] > 100]
    assert len(eps) == 1 and eps[0]["fromStep"] == 2001 and eps[0]["toStep"] == 2300
    assert eps[0]["medianSeconds"] == pytest.approx(6.1, abs=0.2)
    bs = gserver.get("/v1/lineage/runs/bs-perf")
    assert bs["config"]["tensor_model_parallel_size"] == 4
    assert "pretrain_gpt.py" in bs["launchCommand"]
    ends = bs["infrastructure"]["jobEnds"]
    assert len(ends) == 1 and json.loads(ends[0]["attrs"])["end"] == "time_limit"
    # The scheduler stopped it at its time limit: stopped, not failed (it was FAILED, and its
    # unlogged last iterations were charged as a recovery that never came).
    assert gserver.get("/v1/runs/bs-perf")["status"] == "STOPPED"
    # Goodput is computed retroactively from the imported timeline.
    gp = gserver.get("/v1/runs/bs-perf/goodput")
    assert gp["breakdown"]["wallSeconds"] > 0
    lines = {x["category"]: x["seconds"] for x in gp["breakdown"]["lines"]}
    assert lines["recovery"] == 0.0


@pytest.mark.e2e
def test_cli_import_dry_run(gserver: Server) -> None:
    s = _cli(
        gserver,
        "import",
        "megatron",
        str(BIG / "meg_gpt2_base_n8_dp1_tp4_pp8-1809562.out"),
        "--run",
        "bs-base",
    )
    assert s["steps"] == 200 and s["events"][-1]["kind"] == "preemption"
    assert s["worldSize"] == 32  # world_size in the log's arguments: 8 nodes x 4 GPUs
    run = gserver.get("/v1/runs/bs-base")
    assert run["steps"] == 200 and run["worldSize"] == 32
    # the run page says what the API says (it said "Ranks 1": the one rank the log stands for)
    summary = gserver.get("/v1/runs/bs-base/overview")["summary"]
    assert summary["worldSize"] == 32 and summary["ranksReporting"] == 1, summary
    assert run["config"]["devices"] == 32 and run["config"]["dtype"] == "fp16"


@pytest.mark.e2e
def test_an_imported_log_is_history_not_a_hung_run(tmp_path: Path) -> None:
    """Logs that end without an end line (the DeepSpeed runs, the golden values) were called
    hung from their last line until now ("no progress for 96,017,582 s") and STALLED."""
    from fleetlens.importers.runlog import batches

    srv = Server(
        str(tmp_path / "data"),
        env={"FLEETLENS_ANALYSIS_INTERVAL_S": "1", "FLEETLENS_HANG_S": "5"},
    ).start()
    try:
        imported = {
            "ds-off": read_megatron(BIG / "meg_ds_3d_gpt2_perf_n16-ds-off.out"),
            "ds-on": read_megatron(BIG / "meg_ds_3d_gpt2_perf_n16-ds-on.out"),
        }
        for run_id, run in imported.items():
            for _, body in batches(run, run_id):
                assert srv.post(body, encoding="gzip")[0] == 200
        # A live run that stopped a minute ago, its processes still beating: the analysis
        # calls it hung (the control).
        _, body = step_batch("live", range(0, 20), 2, t0=time.time() - 70)
        assert srv.post(body)[0] == 200
        hb = TableBuilder("heartbeat").add("time", [time.time() - 1.0] * 2).add("rank", [0, 1])
        hb.add("step", [19, 19]).add("phase", ["idle"] * 2).add("since", [time.time() - 50] * 2)
        ctx = {"run_id": "live", "job_id": "j1", "project": "test"}
        assert srv.post(encode_batch({"heartbeat": hb.build()}, ctx)[1])[0] == 200

        def kinds(run_id: str) -> set[str]:
            return {f["diagnosis"] for f in srv.get(f"/v1/runs/{run_id}/diagnosis")["findings"]}

        wait_until(lambda: "hang" in kinds("live"), timeout=60, what="the live run's hang")
        for run_id in imported:
            assert "hang" not in kinds(run_id), srv.get(f"/v1/runs/{run_id}/diagnosis")
            assert srv.get(f"/v1/runs/{run_id}")["status"] == "FINISHED"
    finally:
        srv.stop()


def test_timestamped_megatron_lm_lines_and_what_their_numbers_say() -> None:
    """Megatron-LM's ``[YYYY-mm-dd HH:MM:SS.ffffff] iteration ...`` lines, their clock, and the
    restarts, start-up, slow period and NaN values the numbers show."""
    run = read_megatron(STAMPED)
    a0, r1, r2 = run.attempts
    assert [a.job_id for a in run.attempts] == ["a0", "a0.r1", "a0.r2"]
    # The stamp ends the iteration: iteration 2 (2 s) was printed at 12:00:37.5 UTC.
    assert a0.times[1] == pytest.approx(1704110435.5) and a0.durations[1] == 2.0
    # Iteration 1 took 30 s, 15 x the median: 28 s of it is start-up, not a step.
    assert a0.times[0] == pytest.approx(1704110433.5) and a0.durations[0] == 2.0
    # Relaunched from the iteration-30 checkpoint (the counter goes back): 31..35 are redone.
    assert r1.steps[0] == 31 and any(e["kind"] == "restart" for e in r1.events)
    # 15 minutes without a line and no save or evaluation: a restart.
    assert r2.steps == [41, 42, 43, 44] and any(e["kind"] == "restart" for e in r2.events)
    ck = [e for e in a0.events if e["kind"] == "checkpoint_end"]
    assert len(ck) == 1 and ck[0]["attrs"]["duration_s"] == pytest.approx(40.0)
    s = run.summary()
    assert s.non_finite == {"iteration_time": 1, "loss": 1}  # iteration 45: nan time and loss
    assert s.to_step == 44 and r2.scalars["loss"][0][-1] == 45
    assert [(p.from_step, p.to_step) for p in s.slow_periods] == [(21, 26)]
    assert s.world_size == 64 and s.restarts == 2
    c = run.config
    assert (c["tensor_model_parallel_size"], c["pipeline_model_parallel_size"]) == (8, 2)
    assert c["data_parallel_size"] == 4 and c["devices"] == 64 and c["dtype"] == "bf16"
    # 32 x (4 h^2 + 3 h ffn) + vocab x h, h = 4096, ffn = 11008, vocab 32000 (SwiGLU).
    assert c["n_params"] == 32 * (4 * 4096**2 + 3 * 4096 * 11008) + 32000 * 4096


def test_launcher_prefixed_stamped_line_and_nan_elapsed_time() -> None:
    from fleetlens.importers.megatron import parse_megatron_log

    line = (
        "[default0]: [2025-02-28 16:25:{s:02d}] iteration {i:8d}/  119209 | consumed samples: "
        "{c} | elapsed time per iteration (ms): {ms} | learning rate: 3.000000E-06 | global "
        "batch size:  2048 | lm loss: {loss} | loss scale: 1.0 | grad norm: 5.334 | number of "
        "skipped iterations:   0 | number of nan iterations:   0 |"
    )
    rows = [(1, "46298.6", "1.233673E+01"), (2, "nan", "1.2E+01"), (3, "1000.0", "inf")]
    text = "\n".join(
        line.format(s=10 * i, i=i, c=2048 * i, ms=ms, loss=loss) for i, ms, loss in rows
    )
    run = parse_megatron_log(text)
    a = run.attempts[0]
    assert a.steps == [1, 3]  # iteration 2's time is nan: not a step, but counted
    assert run.nonfinite == {"iteration_time": 1, "loss": 1}
    # The clock is the stamps: iteration 3 ends when its line was printed, 16:25:30 UTC.
    assert a.times[1] + a.durations[1] == calendar.timegm((2025, 2, 28, 16, 25, 30, 0, 0, 0))
    nan = [e for e in a.events if e["kind"] == "nan"]
    assert len(nan) == 1 and nan[0]["step"] == 3 and nan[0]["attrs"]["metric"] == "loss"


def test_golden_values_nan_is_a_gap_unless_other_metrics_were_recorded() -> None:
    from fleetlens.importers.megatron import parse_golden_values

    run = read_megatron(GOLDEN)
    assert run.nonfinite == {} and "nothing recorded after step 50860" in run.notes[-1]
    vals = {"1": 1.0, "2": 1.0, "3": 1.0, "4": 12.0, "5": 1.0, "6": 1.0, "7": 1.0, "8": 1.0}
    data = {
        "iteration-time": {"start_step": 1, "end_step": 8, "step_interval": 1, "values": vals},
        "lm loss": {"values": {str(k): ("nan" if k >= 7 else 2.0) for k in range(1, 9)}},
        "num-zeros": {"values": {str(k): (0.0 if k == 7 else "nan") for k in range(1, 9)}},
    }
    g = parse_golden_values(data)
    # Step 4 took 12 x the median with no mark in the record: a restart.
    assert [a.steps[0] for a in g.attempts] == [1, 4] and g.summary().restarts == 1
    assert g.attempts[1].times[0] - (g.attempts[0].times[-1] + 1.0) == pytest.approx(11.0)
    # Step 7's loss is nan where num-zeros was recorded: a NaN loss; step 8's is not recorded.
    assert g.nonfinite == {"loss": 1}
    assert [e["step"] for e in g.attempts[1].events if e["kind"] == "nan"] == [7]


@pytest.mark.e2e
def test_imported_history_through_the_cli_is_a_real_run(tmp_path: Path) -> None:
    """Through the CLI into a server: the NaN is a finding, restarts and start-up are not
    productive time, the world size and MFU come from the log's arguments."""
    srv = Server(str(tmp_path / "data"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "1"}).start()
    try:
        s = _cli(srv, "import", "megatron", str(STAMPED), "--run", "stamped",
                 "--accelerator", "H100-SXM")  # fmt: skip
        assert s["nonFinite"] == {"iteration_time": 1, "loss": 1} and s["restarts"] == 2
        run = srv.get("/v1/runs/stamped")
        assert run["worldSize"] == 64 and run["steps"] == 44
        gp = srv.get("/v1/runs/stamped/goodput")
        lines = {x["category"]: x["seconds"] for x in gp["breakdown"]["lines"]}
        wall = gp["breakdown"]["wallSeconds"]
        assert lines["productive"] < 0.5 * wall  # 15 min lost to a restart, 20 to a relaunch
        assert lines["rework"] == pytest.approx(5 * 2.0)  # iterations 31..35, redone
        assert lines["recovery"] > 900.0 and lines["startup"] >= 28.0
        assert lines["checkpoint"] == pytest.approx(40.0)
        assert gp["breakdown"]["attempts"] == 3
        assert gp["program"]["devices"] == 64
        assert gp["program"]["programBasis"] == "mfu_retained_steps"
        assert 0.0 < gp["factors"]["program"] < 1.0

        def instability() -> list[dict]:
            f = srv.get("/v1/runs/stamped/diagnosis")["findings"]
            return [x for x in f if x["diagnosis"] == "instability"]

        found = wait_until(instability, timeout=90, what="the NaN loss's finding")
        assert found[0]["step"] == 45
    finally:
        srv.stop()


# Constructed from NeMo's and torchtitan's documented line formats (READMEs beside them).
CONSTRUCTED = Path(__file__).resolve().parent / "data" / "constructed"
NEMO = CONSTRUCTED / "nemo" / "nemo2_llama3_8b.log"
TITAN = CONSTRUCTED / "torchtitan" / "torchtitan_llama3_8b.log"


def test_nemo_and_torchtitan_logs_and_what_their_numbers_say() -> None:
    nemo = read_nemo(NEMO)
    assert [a.job_id for a in nemo.attempts] == ["a0", "a0.r1"]  # global_step went 59 -> 50
    assert nemo.steps == 110 and nemo.world_size == 8
    assert nemo.nonfinite == {"loss": 1} and nemo.slow_periods[0].from_step == 30
    assert nemo.slow_periods[0].to_step == 34
    assert nemo.startup_seconds > 12.0  # the first iteration of each attempt
    titan = read_torchtitan(TITAN)
    assert [(a.steps[0], a.steps[-1]) for a in titan.attempts] == [(1, 130), (101, 200)]
    assert titan.world_size == 8 and titan.config["seq_len"] == 8192
    # 35 s of compile in step 1, and again in the relaunch's first interval (47 s for 10 steps)
    assert titan.startup_seconds == pytest.approx(70.0, abs=0.2)
    assert [(p.from_step, p.to_step) for p in titan.slow_periods] == [(71, 90)]
    saves = [e for a in titan.attempts for e in a.events if e["kind"] == "checkpoint_end"]
    assert [e["step"] for e in saves] == [50, 100, 150, 200]
    # The save is not step time: the interval after it has the steps' own length.
    a = titan.attempts[0]
    assert a.durations[a.steps.index(55)] == pytest.approx(a.durations[a.steps.index(45)], 0.05)
    assert titan.attempts[-1].events[-1]["kind"] == "finish"


@pytest.mark.e2e
def test_nemo_and_torchtitan_through_the_cli_are_real_runs(tmp_path: Path) -> None:
    srv = Server(str(tmp_path / "data"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "1"}).start()
    try:
        n = _cli(srv, "import", "nemo", str(NEMO), "--run", "nemo-8b")
        t = _cli(srv, "import", "torchtitan", str(TITAN), "--run", "titan-8b",
                 "--accelerator", "h100")  # fmt: skip
        assert n["restarts"] == 1 and t["restarts"] == 1
        for rid in ("nemo-8b", "titan-8b"):
            run = srv.get(f"/v1/runs/{rid}")
            assert run["worldSize"] == 8 and run["status"] == "FINISHED", run
        gp = srv.get("/v1/runs/titan-8b/goodput")
        lines = {x["category"]: x["seconds"] for x in gp["breakdown"]["lines"]}
        assert lines["recovery"] > 600.0  # the watchdog timeout and the relaunch
        assert lines["rework"] > 0  # steps 101..130, run twice
        assert 27.0 <= lines["checkpoint"] <= 36.0 + 1e-6  # four 9 s saves, the last at the end
        assert lines["startup"] >= 35.0 and gp["breakdown"]["attempts"] == 2

        def instability() -> list[dict]:
            f = srv.get("/v1/runs/nemo-8b/diagnosis")["findings"]
            return [x for x in f if x["diagnosis"] == "instability"]

        assert wait_until(instability, timeout=90, what="the NaN loss")[0]["step"] == 97
    finally:
        srv.stop()


def _iteration_log(times: list[float]) -> str:
    head = (
        "------------------------ arguments ------------------------\n"
        "  log_interval .................................... 10\n"
        "-------------------- end of arguments ---------------------\n"
    )
    return head + "".join(
        f" iteration {10 * (k + 1):8d}/{10 * len(times):8d} | elapsed time per iteration (ms): "
        f"{1000 * t:.1f} | lm loss: 5.0E+00 | number of nan iterations:   0 |\n"
        for k, t in enumerate(times)
    )


def test_a_resume_is_a_spike_over_its_neighbours_and_a_slow_stretch_a_level() -> None:
    """Resumes at 9.7x the median went unseen under a fixed 10x rule (goodput said 99.96%
    productive), and a 2.4x interval beside a 1.7x one was no slow period (issue 36)."""
    rng = np.random.default_rng(3)
    times = list(1.0 * rng.lognormal(0.0, 0.05, 120))
    times[40] = 9.7  # a resume: one line far above the lines around it
    times[80], times[81] = 2.4, 1.7  # a slower stretch of two lines
    run = parse_megatron_log(_iteration_log(times), "resume.log")
    restarts = [e for a in run.attempts for e in a.events if e["kind"] == "restart"]
    assert [(e["step"], e["attrs"]["inferred"]) for e in restarts] == [(401, "iteration time")]
    assert restarts[0]["attrs"]["excess_s"] == pytest.approx(10 * (9.7 - 1.0), rel=0.05)
    assert [(p.from_step, p.to_step) for p in run.slow_periods] == [(801, 820)]
    # Three lines in a row at 4x are a level (a slower stretch), not three resumes.
    times = list(1.0 * rng.lognormal(0.0, 0.05, 120))
    times[60:63] = [4.1, 4.3, 4.2]
    run = parse_megatron_log(_iteration_log(times), "level.log")
    assert len(run.attempts) == 1 and [(p.from_step, p.to_step) for p in run.slow_periods] == [
        (601, 630)
    ]


def test_start_up_runs_from_the_launch_megatron_states_to_the_first_iteration() -> None:
    """A log with thousands of lines before iteration 1 had a start-up of 0 s (issue 36)."""
    head = (
        " time to initialize megatron (seconds): 118.500\n"
        "[after megatron is initialized] datetime: 2024-01-01 00:02:00 \n"
        "[before the start of training step] datetime: 2024-01-01 00:02:05 \n"
    )
    body = _iteration_log([1.0] * 30)
    run = parse_megatron_log(head + body, "launch.log")
    launch = calendar.timegm((2024, 1, 1, 0, 2, 0)) - 118.5
    assert run.attempts[0].start == pytest.approx(launch)
    assert run.attempts[0].times[0] == pytest.approx(launch + 118.5 + 5)  # iterations: unmoved
    assert run.startup_seconds == pytest.approx(123.5)
