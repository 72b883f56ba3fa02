"""`fleetlens demo --once`, the README's main command, end to end."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetlens.testing import Server, free_port

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """``fleetlens demo --once`` played once for the module: its data directory and output."""
    data = str(tmp_path_factory.mktemp("demo") / "data")
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
    return data, out.stdout


def test_demo_once_plays_the_scenario_and_leaves_it_readable(demo: tuple[str, str]) -> None:
    data, text = demo
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
            try:
                out, _ = proc.communicate(timeout=90)
            except subprocess.TimeoutExpired:  # say where it was: its own log, then its stacks
                dump = ["py-spy", "dump", "--pid", str(proc.pid)]
                stacks = (
                    subprocess.run(dump, capture_output=True, text=True, timeout=60).stdout
                    if shutil.which("py-spy")
                    else "(no py-spy for its stacks)"
                )
                raise AssertionError(
                    f"no exit 90 s after Ctrl-C:\n{err_path.read_text()[-3000:]}\n{stacks[-6000:]}"
                ) from None
        finally:
            if proc.poll() is None:
                proc.kill()
    log = err_path.read_text()
    assert proc.returncode == 0, (proc.returncode, log[-3000:])
    assert "what fleetlens found" in out.decode()
    assert "Warning" not in log, log


# ---- the README's commands and code, as written, against the demo's runs ------------------
# A placeholder left once the demo's runs are put in (``FILE``, ``LOG``, ``DIR``, ``ID``,
# ``MODEL``...) names what the demo cannot supply: a file to read (each importer has tests on
# real files of its own) or an object the demo makes none of.
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(\.yaml)?(\[@[A-Z]+\])?$")
# Commands that serve, or play or work until stopped (`demo` is the fixture above).
_LONG_RUNNING = ("serve", "demo", "agent", "eval worker", "sim run")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README.read_text(), re.S | re.M)


def _without_optional(line: str) -> str:
    while (stripped := re.sub(r"\s*\[[^\[\]]*\]", "", line)) != line:
        line = stripped
    return line


def readme_commands(runs: dict[str, str]) -> list[tuple[str, list[str] | None]]:
    """Every ``fleetlens`` line of the README's shell blocks, as a synopsis reads: optional
    ``[...]`` parts left out, each `` | `` alternative a command of its own (after the words
    the first names before its subcommand), a ``a|b`` choice its first, ``RUN`` the demo's
    simulated run and ``A B`` its two runs. ``None`` where the line needs what the demo has
    not (see ``_PLACEHOLDER``) or runs until stopped."""
    out: list[tuple[str, list[str] | None]] = []
    for block in _blocks("sh"):
        for raw in block.splitlines():
            line = raw.split("  #", 1)[0].strip()
            if not line.startswith("fleetlens "):
                continue
            for part in re.split(r",\s*(?=fleetlens )", line):
                alts = [a.strip() for a in _without_optional(part).split(" | ")]
                head = alts[0].split()
                # the subcommand an alternative replaces: the first's last plain word before
                # its arguments (an option, a placeholder)
                plain = next((i for i, w in enumerate(head) if not w.islower() or w[0] == "-"),
                             len(head))  # fmt: skip
                sub = plain - 1
                for i, alt in enumerate(alts):
                    words = (head[:sub] if i else []) + alt.split()
                    words = [w.split("|")[0] if "|" in w else w for w in words]
                    words = [runs.get(w, w) for w in words]
                    cmd = " ".join(words)
                    if any(_PLACEHOLDER.match(w) for w in words) or any(
                        cmd.startswith(f"fleetlens {x}") for x in _LONG_RUNNING
                    ):
                        out.append((cmd, None))
                    else:
                        out.append((cmd, words[1:]))
    return out


def test_every_readme_command_runs_as_written_against_the_demo(demo: tuple[str, str]) -> None:
    """The README's CLI lines and its notebook block, as written, against the demo's data (a
    server on it): each exits 0 and prints something. The instrumentation blocks are code a
    training loop is made of; tests/realcode is instrumented exactly as they show."""
    data, _ = demo
    server = Server(data).start()
    try:
        runs = {r["runId"]: r for r in server.get("/v1/runs")["runs"]}
        sim = next(r for r in runs if r.startswith("demo-run-"))
        ddp = next(r for r in runs if r != sim)
        env = {**os.environ, "FLEETLENS_SERVER": server.url, "FLEETLENS_DATA": data}
        commands = readme_commands({"RUN": sim, "A": sim, "B": ddp})
        ran = [(cmd, argv) for cmd, argv in commands if argv is not None]
        assert len(ran) >= 15, commands
        failed = []
        for cmd, argv in ran:
            out = subprocess.run([sys.executable, "-m", "fleetlens", *argv], env=env,
                                 capture_output=True, text=True, timeout=120)  # fmt: skip
            if out.returncode != 0 or not out.stdout.strip():
                failed.append((cmd, out.returncode, (out.stdout + out.stderr)[-800:]))
        assert not failed, failed
        (client,) = [b for b in _blocks("python") if "fleetlens.Client()" in b]
        code = client.replace('"r918"', repr(sim))
        assert code != client, "the notebook block names no run"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
    finally:
        server.stop()
