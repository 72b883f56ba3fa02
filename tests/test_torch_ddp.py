"""The real 4-process DDP example (torchrun, gloo, CPU) against a real server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401 - the integration needs it installed; CI installs it

from fleetlens.testing import Server

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[1] / "fleetlens" / "examples" / "ddp_train.py"


def test_slow_rank_is_the_straggler_and_last_arriver_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    server = Server(str(tmp_path / "data"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "1"}).start()
    try:
        _check(server, tmp_path)
    finally:
        server.stop()


def _check(server: Server, tmp_path: Path) -> None:
    stats = tmp_path / "stats"
    stats.mkdir()
    steps, slow, start = 30, 2, 10
    env = {
        **os.environ,
        "FLEETLENS_SERVER": server.url,
        "FLEETLENS_RUN_ID": "ddp-slow",
        # Its own spools (one per rank, under TMPDIR): a spool left by an earlier run of this
        # id would be replayed here.
        "TMPDIR": str(tmp_path),
        "OMP_NUM_THREADS": "1",
        # "Nothing left unsent" is the claim: finish() may take up to a minute to send it to a
        # server answering slowly (this machine's load; 5 s by default, then the spool).
        "FLEETLENS_EXIT_FLUSH_S": "60",
    }
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "4",
            str(EXAMPLE),
            "--steps",
            str(steps),
            "--slow-rank",
            str(slow),
            "--slow-ms",
            "100",
            "--from-step",
            str(start),
            "--stats-dir",
            str(stats),
            "--checkpoint-every",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    ranks = [json.loads((stats / f"rank{r}.json").read_text()) for r in range(4)]
    for r in ranks:  # nothing dropped, nothing rejected, nothing left unsent
        s = r["stats"]
        assert (s["dropped"], s["rejected_batches"], s["spool_files"], r["torch_errors"]) == (
            0,
            0,
            0,
            0,
        ), s
        assert s["records_sent"] == s["records"]

    run = server.get("/v1/runs/ddp-slow")
    assert run["steps"] == steps and run["worldSize"] == 4 and run["project"] == "ddp-example"
    assert run["config"]["model"] == "tiny-lm"
    loss = server.get("/v1/runs/ddp-slow/metrics?name=loss")["points"]
    assert [p["step"] for p in loss] == list(range(steps))
    assert loss[-1]["value"] < loss[0]["value"]  # it learns

    window = f"fromStep={start + 2}&toStep={steps - 1}"
    by_compute = server.get(f"/v1/runs/ddp-slow/ranks?sort=compute&order=desc&{window}")["ranks"]
    assert by_compute[0]["rank"] == slow and by_compute[0]["computeSlowdown"] > 1.5
    # The others' waiting is attributed to it: they wait, it does not.
    waits = {r["rank"]: r["commMs"] for r in by_compute}
    assert all(waits[slow] < waits[r] for r in waits if r != slow)

    # The analysis loop flags it, names it the last arriver at the collectives, and says who
    # owns the problem.
    deadline = time.monotonic() + 60
    stragglers: list[dict[str, object]] = []

    def during_slowdown() -> list[dict[str, Any]]:
        """Findings that reach into the slowed steps. Four processes share two cores here: a
        rank the scheduler starves for the first steps is slow for real, and may be found for
        those steps; nothing but the slowed rank may be found once it is slowed."""
        found = server.get("/v1/runs/ddp-slow/stragglers")["stragglers"]
        return [s for s in found if s["endStep"] is None or s["endStep"] >= start]

    while time.monotonic() < deadline and not stragglers:
        stragglers = during_slowdown()
        time.sleep(0.5)
    assert stragglers and stragglers[0]["ranks"] == [slow], stragglers
    # Slowed from step 10 to the end: one persistent straggler, once all its steps are in.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and [
        (s["diagnosis"], s["ranks"], s["endStep"]) for s in stragglers
    ] != [("straggler.persistent", [slow], None)]:
        time.sleep(0.5)
        stragglers = during_slowdown()
    assert [(s["diagnosis"], s["ranks"]) for s in stragglers] == [
        ("straggler.persistent", [slow])
    ], stragglers
    (last,) = [e for e in stragglers[0]["evidence"] if e.get("signal") == "last_arriver"]
    # Most of the time (four processes share two cores here, so not always).
    assert last["rank"] == slow and last["value"] >= 0.6, last
    assert last["waitedForMedianS"] > 0.05  # the others waited ~100 ms for it

    timeline = server.get("/v1/runs/ddp-slow/timeline?fromStep=0&toStep=29")["items"]
    ckpts = [i for i in timeline if i["kind"] == "checkpoint_end"]
    assert [c["step"] for c in ckpts] == [10, 20] and all(
        c["attrs"]["size_bytes"] > 0 for c in ckpts
    )
    # The run graph carries each checkpoint's own sha256, as its manifest says (issue 20: the
    # collector read another attribute, and a model version's provenance lost the hash).
    graph = server.get("/v1/runs/ddp-slow/checkpoints")["checkpoints"]
    for step in (10, 20):
        man = json.loads((stats / f"ckpt-{step:08d}.json").read_text())
        (row,) = [c for c in graph if c["step"] == step]
        assert row["checksum"] == f"sha256:{man['sha256']}", row


def test_a_hung_rank_is_named_from_its_heartbeats_within_the_hang_threshold(
    tmp_path: Path,
) -> None:
    """Rank 1 stops before step 12 (a hung GPU); the other three wait for it in the step's
    all-reduce. No step ends any more, but every process is alive and its SDK keeps sending
    heartbeats: the server names rank 1 (the one behind the others) once the run's own clock
    is one hang threshold (max(10 x step, 60 s): 60 s for these tiny steps) past the last
    progress, and not before."""
    server = Server(str(tmp_path / "data"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "1"}).start()
    hung, at = 1, 12
    env = {
        **os.environ,
        "FLEETLENS_SERVER": server.url,
        "FLEETLENS_RUN_ID": "ddp-hang",
        # Its own spools (one per rank, under TMPDIR): a spool left by an earlier run of this
        # id would be replayed here.
        "TMPDIR": str(tmp_path),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
         str(EXAMPLE), "--steps", "1000", "--hang-rank", str(hung), "--hang-at-step", str(at)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tmp_path,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        hangs: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not hangs:
            assert proc.poll() is None, "the job ended; it should hang"
            try:
                found = server.get("/v1/runs/ddp-hang/diagnosis")["findings"]
            except urllib.error.HTTPError:  # 404 until the run's first batch
                found = []
            # The analysis loop's finding (the remediation controller, which reads the ranks'
            # control-channel polls, may name the same rank under its own "stuck:" key).
            hangs = [f for f in found if f["key"].startswith("hang:")]
            time.sleep(1.0)
        assert hangs, "no hang found"
        (h,) = hangs
        assert h["ranks"] == [hung] and h["step"] == at, h
        since = h["evidence"][0]["since"]  # the end of step 11, the last progress
        threshold = h["evidence"][0]["threshold"]
        assert threshold == 60.0
        # Judged on the run's clock: called one threshold after the last progress ...
        assert h["time"] == pytest.approx(since + threshold, abs=1.0)
        # ... and named on the server (when the finding was first recorded, not when this
        # test's poll came round) within a heartbeat period (10 s) and the pass after that,
        # which a machine this loaded (two cores, three test files at once) may start late.
        assert h["firstSeen"] - since < threshold + 30.0, h["firstSeen"] - since
        beats = next(e for e in h["evidence"] if e["metric"].startswith("rank heartbeats"))
        assert beats["value"][str(hung)][1:3] == [at - 1, "idle"]
    finally:
        # torchrun starts each worker in a session of its own: killing torchrun's group would
        # leave them running (the hung one forever). SIGTERM makes torchrun stop them.
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        server.stop()
