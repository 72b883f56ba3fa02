"""`fleetlens demo --once`, the README's main command, end to end."""

from __future__ import annotations

import subprocess
import sys

from .helpers import Server, free_port


def test_demo_once_plays_the_scenario_and_leaves_it_readable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = str(tmp_path / "data")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetlens",
            "demo",
            "--once",
            "--data",
            data,
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "256 ranks, 2400 steps in 2 job attempts" in text
    assert "where the time went:" in text and "rework" in text
    # The injected straggler (rank 37) is the slowest rank by compute.
    slowest = text.split("slowest ranks by compute time")[1].splitlines()[1]
    assert slowest.split()[1] == "37"
    assert "hardware_fault NVRM: Xid 79" in text
    assert "fleetlens run show" in text and "/docs" in text
    # What was found, matched one to one to what was injected, with when it was found.
    found = text.split("what fleetlens found, against what was injected:")[1]
    assert "4 of 4 injected faults found; 0 other findings" in found, found
    assert "NOT FOUND" not in found
    injected = [ln for ln in found.splitlines() if ln.strip().startswith("injected ")]
    assert [ln.split()[1] for ln in injected] == [
        "straggler.persistent", "thermal", "fatal_xid", "data_stall"]  # fmt: skip
    assert "found    persistent straggler: rank 37" in found
    assert "steps after onset), shown" in found or "step after onset), shown" in found
    # The real 4-process DDP run beside the simulation: its slowed rank 2 is found.
    real = text.split("real DDP run")[1]
    first = real.split("ranks by compute time")[1].splitlines()[1]
    assert first.split()[1] == "2:", real
    assert "arrived last in" in real, real

    server = Server(data).start()
    try:
        runs = server.get("/v1/runs")["runs"]
        sim = [r for r in runs if r["runId"].startswith("demo-run-")]
        assert len(runs) == 2 and len(sim) == 1
        assert sim[0]["status"] == "FINISHED" and sim[0]["jobs"] == 2
        run = server.get(f"/v1/runs/{sim[0]['runId']}")
        assert run["steps"] == 2400 and run["worldSize"] == 256
    finally:
        server.stop()


def test_demo_stops_on_ctrl_c_with_exit_status_0(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C while the demo serves: it stops its server, closes its stores and exits 0 (it
    died of SIGSEGV in chDB's exit-time teardown, status -11), with no library warning."""
    import signal
    import time

    err_path = tmp_path / "err.txt"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetlens", "demo", "--no-ddp", "--scenario", "data_stall",
             "--data", str(tmp_path / "data"), "--port", str(free_port())],
            stdout=subprocess.PIPE, stderr=err,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 240
            while b"Ctrl-C to stop" not in err_path.read_bytes():
                assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()
                time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
    log = err_path.read_text()
    assert proc.returncode == 0, (proc.returncode, log[-3000:])
    assert "what fleetlens found" in out.decode()
    assert "Warning" not in log, log
