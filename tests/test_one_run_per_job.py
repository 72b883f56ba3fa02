"""One run per job whatever the launcher: the ranks agree on a run id the launcher did not name.

Real launchers on real processes: ``torchrun --master-port P`` without ``--rdzv-id`` (nanoGPT's
own docstring's command; it sets ``TORCHELASTIC_RUN_ID=none``), and a Python launcher that
forks its ranks with only RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* (DeepSpeed's ``launch.py`` and
``torch.distributed.launch`` do so) with no store to ask.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from fleetlens.testing import Server, free_port, wait_until

pytestmark = pytest.mark.e2e

_WORKER = textwrap.dedent(
    """
    import os
    import fleetlens
    run = fleetlens.init(project="one-run")
    for i in range(5):
        with run.step(i, tokens=8):
            pass
    run.finish()
    # One write of the whole line: the ranks share the pipe, and print() unbuffered
    # (PYTHONUNBUFFERED) writes the id and its newline apart, letting another rank's in between.
    os.write(1, (run.config.run_id + "\\n").encode())
    """
)

_LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys
    world = int(sys.argv[1])
    procs = [subprocess.Popen([sys.executable, "-c", sys.argv[2]],
                              env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r),
                                   "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": sys.argv[3]})
             for r in range(world)]
    sys.exit(max(p.wait() for p in procs))
    """
)


def _one_run(server: Server, cmd: list[str]) -> dict[str, object]:
    env = {**os.environ, "FLEETLENS_SERVER": server.url, "FLEETLENS_RELAY": "off"}
    env.pop("FLEETLENS_RUN_ID", None)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    ids = set(done.stdout.split())
    assert len(ids) == 1, f"each rank made up its own run: {ids}"
    runs = wait_until(
        lambda: (r := server.get("/v1/runs")["runs"]) and r[0]["status"] == "FINISHED" and r,
        30,
        0.2,
        "the run finished",
    )
    assert [r["runId"] for r in runs] == list(ids)
    run = server.get(f"/v1/runs/{runs[0]['runId']}")
    assert (run["worldSize"], run["ranksReporting"], run["jobs"]) == (4, 4, 1)
    return run


def test_torchrun_with_a_master_port_and_no_rdzv_id_is_one_run(server: Server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    _one_run(
        server,
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "4",
            "--master-port",
            str(free_port()),
            str(script),
        ],
    )


def test_ranks_forked_by_one_python_launcher_are_one_run(server: Server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    launcher = tmp_path / "launch.py"  # DeepSpeed's is deepspeed/launcher/launch.py
    launcher.write_text(_LAUNCHER)
    _one_run(server, [sys.executable, str(launcher), "4", _WORKER, str(free_port())])


def test_two_jobs_started_in_turn_by_one_script_are_two_runs(server: Server) -> None:
    """A sweep or a notebook is no launcher: its jobs do not share a run id."""
    env = {**os.environ, "FLEETLENS_SERVER": server.url, "FLEETLENS_RELAY": "off"}
    env.pop("FLEETLENS_RUN_ID", None)
    jobs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", _LAUNCHER, "2", _WORKER, str(free_port())],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        jobs.append(set(done.stdout.split()))
    assert not jobs[0] & jobs[1]
