"""Time to result (seed 000; 003 s9.9.4): when a running run reaches the step count its config
names, at its recent wall-clock pace, in the API, the CLI and the run page's data."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from fleetlens.testing import Server, step_batch
from fleetlens.wire import TableBuilder, encode_batch

pytestmark = pytest.mark.e2e


def test_a_running_run_with_a_target_has_its_completion_and_an_ended_one_none(
    server: Server,
) -> None:
    # 100 steps of 0.4 s, one every 0.48 s (the 0.08 s between them count), the last a few
    # seconds ago; nanoGPT's config names its target max_iters
    t0 = time.time() - 100 * 0.48
    assert server.post(step_batch("eta-run", range(0, 100), 4, t0=t0)[1])[0] == 200
    st, _ = server.request("POST", "/v1/runs/eta-run/describe", {"config": {"max_iters": 1000}})
    assert st == 200
    run = server.get("/v1/runs/eta-run")
    assert run["status"] == "RUNNING", run
    done = run["completion"]
    assert done["totalSteps"] == 1000 and done["targetKey"] == "max_iters", done
    assert done["stepsLeft"] == 900 and abs(done["secondsPerStep"] - 0.48) < 1e-6, done
    assert abs(done["seconds"] - 432.0) < 1e-3 and done["finishAt"] > time.time() + 400, done
    page = server.get("/v1/runs/eta-run/overview")
    assert page["completion"]["stepsLeft"] == 900
    out = subprocess.run(
        [sys.executable, "-m", "fleetlens", "run", "show", "eta-run", "--server", server.url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "completion: step 99 of 1,000 (max_iters), 0.48 s/step lately: 7.2 min left" in (
        out.stdout
    ), out.stdout

    # it finished: no estimate
    ev = TableBuilder("event")
    ev.add("time", [time.time()]).add("kind", ["finish"]).add("step", [99])
    _, body = encode_batch({"event": ev.build()}, {"run_id": "eta-run", "job_id": "j1"})
    assert server.post(body)[0] == 200
    run = server.get("/v1/runs/eta-run")
    assert run["status"] == "FINISHED" and run.get("completion") is None, run


def test_a_run_without_a_target_has_no_completion(server: Server) -> None:
    assert server.post(step_batch("no-target", range(0, 20), 2)[1])[0] == 200
    run = server.get("/v1/runs/no-target")
    assert run.get("completion") is None and run["wallSecondsPerStep"] > 0, run


def test_a_token_budget_gives_the_steps_left_at_the_runs_tokens_per_step(server: Server) -> None:
    """A pretraining run budgeted in tokens (no step count): 100 steps of 4 ranks x 1,000
    tokens done of 1,000,000: 600,000 left, 150 more steps at its 4,000 a step, 0.48 s each."""
    t0 = time.time() - 100 * 0.48
    assert server.post(step_batch("eta-tokens", range(0, 100), 4, t0=t0)[1])[0] == 200
    body = {"config": {"total_tokens": 1_000_000}}
    assert server.request("POST", "/v1/runs/eta-tokens/describe", body)[0] == 200
    done = server.get("/v1/runs/eta-tokens")["completion"]
    assert done["targetKey"] == "total_tokens" and done["tokensLeft"] == 600_000, done
    assert done["stepsLeft"] == 150 and done["totalSteps"] == 250, done
    assert abs(done["seconds"] - 150 * 0.48) < 1e-3, done
    out = subprocess.run(
        [sys.executable, "-m", "fleetlens", "run", "show", "eta-tokens", "--server", server.url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "completion: step 99 of 250 (total_tokens: 600,000 tokens left)" in out.stdout, out
