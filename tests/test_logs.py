"""Logs by step (issue 39 item 5, seed 001 s57): the ranks' log lines, stored with run, rank and
step, searchable from the CLI, the API and the run page, and a finding's lines around it.

The end-to-end test trains a real model with torch on the CPU, instrumented as the docs show
and run with ``FLEETLENS_LOGS=1``; it logs with ``logging`` (configured after ``init``, as
scripts do) and prints. Its fault comes from outside: the shard it reads every step is deleted
from under it, and the ``FileNotFoundError`` it dies of is in its stderr, with the step.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fleetlens.schema import LOG_LEVELS
from fleetlens.sdk import logs as sdk_logs
from fleetlens.sdk.buffer import RecordBuffer
from fleetlens.testing import Server, wait_until

from .test_cli import fleetlens_cmd

pytestmark = pytest.mark.unit


class _Capture:
    """A LogCapture on a buffer of its own, at the step the test says."""

    def __init__(self) -> None:
        self.buffer = RecordBuffer((10, 10, 10, 100_000))
        self.step = -1
        self.cap = sdk_logs.LogCapture(self.buffer, 3, lambda: (self.step, "idle", 0.0))

    def rows(self) -> list[dict[str, Any]]:
        return [e[2] for e in self.buffer.queues[3] if e[1] == "log"]


def test_prints_and_logging_records_are_lines_with_their_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    root = logging.getLogger()
    kept = (root.handlers[:], root.level)
    c = _Capture()
    try:
        print("before the first step")
        c.step = 4
        print("iter 4: loss 2.3000", end="")  # a line written in two parts
        print(", time 12ms")
        sys.stderr.write("epoch 1:  10%|#         | 1/10\repoch 1: 100%|##########| 10/10\n")
        # configured after init, as a script does: basicConfig still sets up its handler
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, force=True)
        logging.getLogger("train").warning("grad norm %.1f", 9.5)
        logging.getLogger("train").debug("not let through by the level")
        quiet = logging.getLogger("quiet")  # a record no handler prints (a file handler's)
        quiet.propagate = False
        quiet.warning("epoch 3")
        print("epoch 3 done, loss 1.2")  # holds the record's text: still a line of its own
        sys.stdout.write("no newline yet")
    finally:
        c.cap.close()
        root.handlers[:] = kept[0]
        root.setLevel(kept[1])
    assert sys.stdout is out and sys.stderr is err  # put back
    assert out.getvalue().startswith("before the first step\niter 4: loss 2.3000, time 12ms\n")
    assert "WARNING:train:grad norm 9.5" in err.getvalue()  # the handler still wrote it
    got = [(r["step"], r["level"], r["source"], r["message"]) for r in c.rows()]
    assert got == [
        (-1, "INFO", "stdout", "before the first step"),
        (4, "INFO", "stdout", "iter 4: loss 2.3000, time 12ms"),
        (4, "ERROR", "stderr", "epoch 1: 100%|##########| 10/10"),  # the bar's last state
        (4, "WARNING", "train", "grad norm 9.5"),  # once: not again as its stderr line
        (4, "WARNING", "quiet", "epoch 3"),
        (4, "INFO", "stdout", "epoch 3 done, loss 1.2"),
    ]
    assert {r["rank"] for r in c.rows()} == {3} and all(r["level"] in LOG_LEVELS for r in c.rows())


def test_a_flood_of_lines_is_bounded_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    c = _Capture()
    try:
        for i in range(int(sdk_logs.BURST) + 500):
            print(f"line {i}" + "x" * 3000)
    finally:
        c.cap.close()
    rows = c.rows()
    assert int(sdk_logs.BURST) <= len(rows) < int(sdk_logs.BURST) + 500
    assert c.cap.dropped == int(sdk_logs.BURST) + 500 - len(rows)
    assert max(len(r["message"]) for r in rows) == sdk_logs.MAX_LINE


_SHARDED = textwrap.dedent(
    """
    import logging, sys
    import torch
    import fleetlens, fleetlens.torch

    run = fleetlens.init(project="p", run_id="logs-run", install_signal_handler=False)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log = logging.getLogger("train")
    tr = fleetlens.torch.TorchRun(run, "cpu")
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    shard = sys.argv[1]
    for i in range(1_000_000):
        with tr.step(i):
            x = torch.load(shard)  # the step's batch, read from the shard every step
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        if i % 5 == 0:
            log.info("step %d loss %.4f", i, loss.item())
            print(f"iter {i}: loss {loss.item():.4f}")
        tr.log(i, loss=loss)
    """
)


@pytest.mark.e2e
def test_a_real_jobs_lines_are_searchable_and_its_failure_links_the_lines_around_it(
    server: Server, tmp_path: Path, browser: Any
) -> None:
    import torch

    shard = tmp_path / "shard-00001.pt"
    torch.save(torch.randn(64, 256), shard)
    script = tmp_path / "train.py"
    script.write_text(_SHARDED)
    env = {
        **os.environ,
        "FLEETLENS_SERVER": server.url,
        "FLEETLENS_LOGS": "1",
        "OMP_NUM_THREADS": "1",
        "FLEETLENS_SPOOL_DIR": str(tmp_path / "spool"),
        "FLEETLENS_RELAY": "off",
    }
    proc = subprocess.Popen(
        [sys.executable, str(script), str(shard)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def at_step_20() -> bool:
            status, doc = server.request("GET", "/v1/runs/logs-run")
            return status == 200 and (doc.get("lastStep") or 0) >= 20

        wait_until(at_step_20, 60, what="the run past step 20")
        shard.unlink()  # the storage lost the shard
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0 and "FileNotFoundError" in err, err[-2000:]
    assert "iter 20: loss" in out  # the tee wrote through

    def failure() -> dict[str, Any] | None:
        doc = server.get("/v1/runs/logs-run/diagnosis")
        return next((f for f in doc["findings"] if f.get("kind") == "failure"), None)

    finding = wait_until(failure, 60, what="the failure's finding")
    step = finding["step"]
    assert step > 20, finding
    around = server.get(f"/v1/runs/logs-run/logs?around={step}&rank=0")
    assert (around["fromStep"], around["toStep"]) == (step - 2, step + 2)
    errors = [x for x in around["lines"] if x["source"] == "stderr"]
    assert errors and all(x["level"] == "ERROR" for x in errors), around
    assert any("FileNotFoundError" in x["message"] for x in errors), around
    assert all(step - 2 <= x["step"] <= step + 2 for x in around["lines"])
    # searched by text: the logging records and the prints, each with its step
    found = server.get("/v1/runs/logs-run/logs?q=STEP%2010%20LOSS")["lines"]
    assert [(x["step"], x["level"], x["source"]) for x in found] == [(10, "INFO", "train")]
    printed = server.get("/v1/runs/logs-run/logs?q=iter%2015:")["lines"]
    assert [(x["step"], x["source"]) for x in printed] == [(15, "stdout")]
    warned = server.get("/v1/runs/logs-run/logs?level=WARNING")["lines"]
    assert warned and {x["level"] for x in warned} <= {"WARNING", "ERROR", "CRITICAL"}
    assert server.request("GET", "/v1/runs/no-such-run/logs")[0] == 404

    done = fleetlens_cmd("logs", "logs-run", "--grep", "filenotfounderror", "--server", server.url)
    assert done.returncode == 0, done.stderr
    line = done.stdout.splitlines()[-1]
    assert line.split()[:5] == ["step", str(step), "rank", "0", "ERROR"], done.stdout
    assert "FileNotFoundError" in line and "stderr:" in line

    page = browser.new_page()
    try:
        page.goto(f"{server.url}/runs/logs-run")
        # what its speed was measured on, under "Now" (the measurement contract)
        import torch

        note = page.locator("#contract-note", has_text=f"Measured on torch {torch.__version__}")
        note.wait_for(timeout=60_000)
        assert "on 1 node x 1 rank on CPU" in note.inner_text()
        link = page.locator("#findings a", has_text=f"lines around step {step}").first
        link.wait_for(timeout=60_000)
        link.click()
        page.locator("#logs-note", has_text="steps").wait_for(timeout=30_000)
        assert f"steps {step - 2}–{step + 2}" in page.inner_text("#logs-note")
        assert "FileNotFoundError" in page.inner_text("#logs")
        assert f"logaround={step}" in page.url
        page.fill("#logs-q", "iter 15:")
        page.fill("#logs-around", "")
        page.click("#logs-form button")
        page.locator("#logs tbody td", has_text="iter 15:").wait_for(timeout=30_000)
        cells = [c.inner_text().strip() for c in page.query_selector_all("#logs tbody tr > *")]
        assert cells[:4] == ["15", "0", "INFO", "stdout"], cells
    finally:
        page.close()
