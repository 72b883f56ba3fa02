"""Importing real training logs (BigScience Megatron-DeepSpeed, Megatron-LM CI golden values)."""

from __future__ import annotations

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
from fleetlens.importers.megatron import read_megatron

from .helpers import Server, step_batch, wait_until

REAL = Path(__file__).resolve().parent / "data" / "real" / "training_logs"
BIG = REAL / "bigscience_megatron_deepspeed"
GOLDEN = (
    REAL / "megatron_lm_ci_golden_values" / "gpt3_15b_8t_release__golden_values_dev_dgx_h100.json"
)


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
    assert end["kind"] == "failure" and end["attrs"]["end"] == "cancelled"
    assert "--tensor-model-parallel-size 4" in base.launch_command

    perf = read_megatron(BIG / "meg_gpt2_perf_n16-1999618.out")
    end = perf.attempts[0].events[-1]
    assert end["kind"] == "failure" and end["attrs"]["end"] == "time_limit"
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
    big = [e for e in eps if e["points"] >= 2]
    assert len(big) == 1
    assert (big[0]["fromStep"], big[0]["toStep"]) == (2100, 2300)
    assert big[0]["medianSeconds"] == pytest.approx(6.1, abs=0.2)
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
    """The installed CLI, ``fleetlens ARGS --server URL``, as a user runs it."""
    out = subprocess.run(
        [sys.executable, "-m", "fleetlens", *args, "--server", server.url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


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
    assert gserver.get("/v1/runs/bs-perf")["status"] == "FAILED"
    # Goodput is computed retroactively from the imported timeline.
    gp = gserver.get("/v1/runs/bs-perf/goodput")
    assert gp["breakdown"]["wallSeconds"] > 0


def test_cli_import_dry_run(gserver: Server) -> None:
    s = _cli(
        gserver,
        "import",
        "megatron",
        str(BIG / "meg_gpt2_base_n8_dp1_tp4_pp8-1809562.out"),
        "--run",
        "bs-base",
    )
    assert s["steps"] == 200 and s["events"][-1]["kind"] == "failure"
    assert gserver.get("/v1/runs/bs-base")["steps"] == 200


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
        # A live run that stopped a minute ago: the analysis calls it hung (the control).
        _, body = step_batch("live", range(0, 20), 2, t0=time.time() - 70)
        assert srv.post(body)[0] == 200

        def kinds(run_id: str) -> set[str]:
            return {f["diagnosis"] for f in srv.get(f"/v1/runs/{run_id}/diagnosis")["findings"]}

        wait_until(lambda: "hang" in kinds("live"), timeout=60, what="the live run's hang")
        for run_id in imported:
            assert "hang" not in kinds(run_id), srv.get(f"/v1/runs/{run_id}/diagnosis")
            assert srv.get(f"/v1/runs/{run_id}")["status"] == "FINISHED"
    finally:
        srv.stop()
