"""Triggered trace capture (issue 39 item 3): a lagging rank and a healthy peer profile a few
steps when the server asks, and the straggler finding shows the two traces side by side.

The server's half on recorded real traces (two ranks of an A100 job, HTA's test data): the
monitor asks the capture of the ranks that offer it on their control polls, the uploads are
imported and kept, bad uploads keep nothing. The job's half on a real torch job is in
tests/test_real_jobs.py (nanoGPT, a rank slowed from outside) and bench/torch_overhead.py.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench._delivery import from_matrix
from fleetlens.config import AnalyzerConfig
from fleetlens.errors import Conflict
from fleetlens.services.captures import Captures
from fleetlens.sim.emit import encode
from fleetlens.store.findings import FindingRow
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.scope import Scope
from fleetlens.testing import InProcessServer, Server, step_batch, wait_until
from fleetlens.traces.capture import rank_summary
from fleetlens.traces.importer import analyze
from fleetlens.traces.kineto import read_trace

REAL = Path(__file__).parent / "data" / "real" / "kineto_traces" / "hta" / "trace_filter_world128"
TRACES = {0: REAL / "sampled_rank-0.json.gz", 1: REAL / "sampled_rank-1.json.gz"}


def _straggler(rank: int, start: int = 10, key: str = "straggler:1") -> FindingRow:
    return FindingRow(key=key, diagnosis="straggler.persistent", kind="straggler",
                      start_step=start, ranks=[rank])  # fmt: skip


@pytest.mark.unit
def test_a_capture_is_asked_of_the_straggler_and_its_lowest_healthy_peer_once(
    tmp_path: Path,
) -> None:
    meta = MetadataStore(f"sqlite:///{tmp_path}/meta.db")
    caps = Captures(meta, AnalyzerConfig(capture_gap_s=100.0, capture_timeout_s=30.0))
    t = 1000.0
    # Nothing is asked of a run none of whose ranks offer.
    caps.plan([("acme", "r", [_straggler(2)])], t)
    assert caps.store.latest("acme", "r") is None
    # Ranks 1-3 offer, two polls 2 s apart, 10 steps a second; rank 0 does not.
    for step, at in ((100, t), (120, t + 2.0)):
        for rank in (1, 2, 3):
            assert caps.offered("acme", "r", rank, "r-a0", step, at) is None
    caps.plan([("acme", "r", [_straggler(2, key="straggler:2")])], t + 2.0)
    asked = caps.offered("acme", "r", 2, "r-a0", 121, t + 2.1)
    assert asked is not None and asked.ranks == (2, 1), asked
    # It starts ahead of the ranks' newest step (10 s at their pace), the same for both.
    assert asked.from_step == 120 + 100 and (asked.steps, asked.warmup) == (3, 1)
    assert caps.offered("acme", "r", 1, "r-a0", 121, t + 2.1) == asked
    assert caps.offered("acme", "r", 3, "r-a0", 121, t + 2.1) is None  # not asked
    assert caps.offered("acme", "r", 2, "r-a1", 0, t + 2.1) is None  # another attempt
    # One open capture a run: a second pass asks nothing more.
    caps.plan([("acme", "r", [_straggler(2, key="straggler:2")])], t + 3.0)
    assert [c.id for c in caps.store.of_run("acme", "r")] == [asked.id]
    # Not in within capture_timeout_s: it expires, saying which ranks did not send.
    caps.plan([], t + 40.0)
    (c,) = caps.store.of_run("acme", "r")
    assert c.state == "expired" and "rank(s) 2, 1" in c.message, c
    assert caps.offered("acme", "r", 2, "r-a0", 400, t + 40.0) is None
    # The gap: no new capture of the run within capture_gap_s of the last one.
    for step, at in ((400, t + 41.0), (420, t + 43.0)):  # two polls: their pace is known
        for rank in (1, 2):
            caps.offered("acme", "r", rank, "r-a0", step, at)
    caps.plan([("acme", "r", [_straggler(2, key="straggler:2")])], t + 50.0)
    assert len(caps.store.of_run("acme", "r")) == 1
    caps.plan([("acme", "r", [_straggler(2, key="straggler:2")])], t + 2.0 + 100.5)
    assert len(caps.store.of_run("acme", "r")) == 2  # past the gap: asked again
    # Nor of a finding that ended, a data stall, or another tenant's run.
    for rank in (1, 2):
        caps.offered("bolt", "r", rank, "r-a0", 400, t + 41.0)
    ended = FindingRow(key="k", diagnosis="straggler.persistent", kind="straggler",
                       ranks=[2], end_step=50)  # fmt: skip
    stall = FindingRow(key="d", diagnosis="data_stall", kind="slowdown", ranks=[2])
    caps.plan([("bolt", "r", [ended, stall])], t + 42.0)
    assert caps.store.of_run("bolt", "r") == [] and len(caps.store.of_run("acme", "r")) == 2


@pytest.mark.unit
def test_a_person_asks_one_capture_at_a_time_of_distinct_ranks(tmp_path: Path) -> None:
    meta = MetadataStore(f"sqlite:///{tmp_path}/meta.db")
    caps = Captures(meta, AnalyzerConfig())
    who = Scope(tenant="acme", role="editor", actor="ana")
    c = caps.request(who, "r", [3, 0], 5, 1000.0)
    assert (c.ranks, c.steps, c.reason, c.finding_key) == ((3, 0), 5, "asked by ana", "")
    with pytest.raises(Conflict, match="still waiting"):
        caps.request(who, "r", [1], 3, 1001.0)
    with pytest.raises(Exception, match="distinct ranks"):
        caps.request(who, "q", [1, 1], 3, 1001.0)


def _put(srv: InProcessServer, cid: int, rank: int, content: bytes) -> tuple[int, Any]:
    return srv.put(f"/v1/runs/cap/traces/captures/{cid}/{rank}", content, "application/gzip")


@pytest.mark.api
def test_the_straggler_finding_shows_the_two_ranks_traces_side_by_side(tmp_path: Path) -> None:
    """Rank 1 computes 30% longer than its peers for 80 steps. The ranks offer capture on their
    control polls; the monitor asks rank 1 and rank 0; their (real) traces come in; the
    finding's evidence holds both, as the traces say, and the run's trace rows have them."""
    env = {"FLEETLENS_ANALYSIS_INTERVAL_S": "0.2"}
    with InProcessServer(str(tmp_path / "data"), env=env) as srv:
        compute = np.full((80, 4), 0.2)
        compute[:, 1] = 0.26
        rec = from_matrix("cap", np.arange(80), compute, time.time() - 60.0)
        for ctx, tables in [*rec.first, *rec.other]:
            assert srv.post(encode(ctx, tables))[0] == 200
        for ctx, cols in rec.steps:
            assert srv.post(encode(ctx, {"step": (len(cols["step"]), cols)}))[0] == 200

        t0 = time.monotonic()

        def poll(rank: int, offer: bool = True) -> Any:
            """A rank's control poll, at 10 steps a second from step 80 (the server needs its
            pace: the capture starts ahead of it)."""
            step = 80 + int(10 * (time.monotonic() - t0))
            q = f"rank={rank}&jobId=cap-a0&world=4&step={step}" + ("&capture=1" if offer else "")
            return srv.get(f"/v1/runs/cap/control?{q}")["capture"]

        def stragglers() -> list[dict[str, Any]]:
            found = srv.get("/v1/runs/cap/diagnosis")["findings"]
            return [f for f in found if f["kind"] == "straggler" and f["ranks"] == [1]]

        wait_until(stragglers, timeout=60)
        asked = wait_until(lambda: [poll(r) for r in range(4)][1], timeout=60)
        assert asked["ranks"] == [1, 0] and asked["steps"] == 3, asked
        assert asked["fromStep"] >= 80 + 90, asked  # 10 s ahead of them at their pace
        assert poll(0) == asked and poll(2) is None and poll(3) is None
        assert poll(1, offer=False) is None  # a rank that does not offer is told nothing

        cid = asked["id"]
        status, got = _put(srv, cid, 1, TRACES[1].read_bytes())
        assert status == 201 and got["state"] == "partial", got
        assert poll(1) is None and poll(0) == asked  # rank 1's is in; rank 0's is not
        status, got = _put(srv, cid, 0, TRACES[0].read_bytes())
        assert status == 201 and got["state"] == "done", got
        assert poll(0) is None

        (finding,) = stragglers()
        (ev,) = [e for e in finding["evidence"] if e.get("signal") == "trace_capture"]
        assert [(r["rank"], r["role"]) for r in ev["ranks"]] == [(1, "lagging"), (0, "peer")]
        for r in ev["ranks"]:  # each rank's figures are its trace's own
            want = rank_summary(analyze(read_trace(TRACES[r["rank"]]), r["rank"])).stored()
            assert {k: r[k] for k in want} == want
            assert not r["hostOnly"] and r["kernels"] > 0 and r["topKernels"], r
            assert r["computeMs"] > 0 and r["stepMs"] >= r["computeMs"], r
        assert ev == got["evidence"]
        ranks = srv.get("/v1/runs/cap/traces")["ranks"]
        assert sorted(r["rank"] for r in ranks) == [0, 1] and all(r["fileBytes"] for r in ranks)


@pytest.mark.api
def test_an_upload_that_is_not_a_profiled_trace_keeps_nothing(tmp_path: Path) -> None:
    with InProcessServer(str(tmp_path / "data")) as srv:
        _, body = step_batch("cap", range(0, 5), 4)
        assert srv.post(body)[0] == 200
        status, c = srv.request("POST", "/v1/runs/cap/traces/captures", {"ranks": [1, 0]})
        assert status == 201 and c["state"] == "requested" and c["steps"] == 3, c
        again = srv.request("POST", "/v1/runs/cap/traces/captures", {"ranks": [2]})
        assert again[0] == 409, again
        assert srv.request("POST", "/v1/runs/cap/traces/captures", {"ranks": []})[0] == 422
        assert srv.request("POST", "/v1/runs/nope/traces/captures", {"ranks": [0]})[0] == 404
        cid = c["captureId"]
        op = {"name": "aten::mm", "ph": "X", "ts": 1, "dur": 2, "pid": 1, "tid": 1}
        no_steps = gzip.compress(json.dumps({"traceEvents": [op]}).encode())
        status, err = _put(srv, cid, 1, no_steps)
        assert status == 400 and "ProfilerStep" in json.dumps(err), err
        assert _put(srv, cid, 1, b"{not gzip")[0] == 415
        assert _put(srv, cid, 2, TRACES[1].read_bytes())[0] == 409  # rank 2 was not asked
        assert _put(srv, 987654, 1, TRACES[1].read_bytes())[0] == 404
        # nothing was kept of any of them: no file, no trace rows, the capture still waits
        assert srv.request("GET", "/v1/runs/cap/traces/files/1")[0] == 404
        assert srv.get("/v1/runs/cap/traces")["ranks"] == []
        assert srv.get(f"/v1/runs/cap/traces/captures/{cid}")["state"] == "requested"


@pytest.mark.e2e
def test_a_person_asks_a_capture_from_the_command_line_and_reads_it_side_by_side(
    tmp_path: Path,
) -> None:
    from .test_cli import fleetlens_cmd

    srv = Server(str(tmp_path / "data")).start()
    try:
        assert srv.post(step_batch("cap", range(0, 5), 4)[1])[0] == 200
        asked = fleetlens_cmd("traces", "capture", "cap", "--rank", "1", "--rank", "0",
                              "--server", srv.url)  # fmt: skip
        assert asked.returncode == 0, asked.stderr
        assert "capture 1 (requested, no steps): asked by local" in asked.stdout, asked.stdout
        assert "rank 1 (named)" in asked.stdout and "not in" in asked.stdout, asked.stdout
        for rank in (1, 0):
            assert srv.put(f"/v1/runs/cap/traces/captures/1/{rank}",
                           TRACES[rank].read_bytes(), "application/gzip")[0] == 201  # fmt: skip
        shown = fleetlens_cmd("traces", "captures", "cap", "--server", srv.url)
        assert shown.returncode == 0, shown.stderr
        doc = srv.get("/v1/runs/cap/traces/captures/1")
        out = [ln.strip() for ln in shown.stdout.splitlines()]
        lines = {k: ln for ln in out for k in ("compute ms", "heaviest kernel") if ln.startswith(k)}
        assert f"capture 1 (done, steps {doc['evidence']['fromStep']}-" in shown.stdout
        for r in doc["evidence"]["ranks"]:  # each rank's figure, in its column
            assert f"{r['computeMs']:.1f}" in lines["compute ms"], shown.stdout
            assert r["topKernels"][0]["name"][:40] in lines["heaviest kernel"], shown.stdout
        empty = fleetlens_cmd("traces", "captures", "none", "--server", srv.url)
        assert empty.returncode != 0
    finally:
        srv.stop()


_LOOP = """
import itertools, os, sys, torch, fleetlens
run = fleetlens.init(project="p", run_id="cap-loop", trace_capture=True,
                     install_signal_handler=False)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
stop_at = int(sys.argv[1])
for i in itertools.count(0, 10):  # the job numbers its steps in tens
    with run.step(i):
        model(torch.randn(32, 64)).sum().backward()
        opt.step()
    if i >= stop_at:
        break
run.finish()
"""


@pytest.mark.e2e
def test_a_real_loop_profiles_its_own_step_numbers_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    """A torch loop whose steps go 0, 10, 20...: asked for 3 steps, it profiles the steps it
    numbers, from the step the capture names, and the server has them as that rank's trace."""
    import subprocess
    import sys

    srv = Server(str(tmp_path / "data")).start()
    try:
        env = {**os.environ, "FLEETLENS_SERVER": srv.url, "TMPDIR": str(tmp_path)}
        log = tmp_path / "loop.log"
        with open(log, "wb") as out:
            job = subprocess.Popen([sys.executable, "-c", _LOOP, "10000000"], env=env,
                                   stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            wait_until(lambda: srv.request("GET", "/v1/runs/cap-loop")[0] == 200, timeout=60)
            status, c = srv.request(
                "POST", "/v1/runs/cap-loop/traces/captures", {"ranks": [0], "steps": 3}
            )
            assert status == 201, c
            done = wait_until(
                lambda: (
                    (d := srv.get(f"/v1/runs/cap-loop/traces/captures/{c['captureId']}"))
                    and d["state"] == "done"
                    and d
                ),
                timeout=90,
            )
        finally:
            job.kill()
            job.wait(30)
        (r,) = done["evidence"]["ranks"]
        assert r["steps"] == 3 and r["toStep"] - r["fromStep"] == 20, r  # its own numbering
        assert r["fromStep"] >= done["fromStep"] + 10 and r["fromStep"] % 10 == 0, (r, done)
        steps = [s["step"] for s in srv.get("/v1/runs/cap-loop/traces?rank=0")["steps"]]
        assert steps == [r["fromStep"], r["fromStep"] + 10, r["toStep"]], steps
    finally:
        srv.stop()


@pytest.mark.unit
def test_a_run_ending_in_the_middle_of_a_capture_stops_the_profiler_and_keeps_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile
    from types import SimpleNamespace

    import torch

    from fleetlens.sdk.control import CaptureAsk
    from fleetlens.torch.capture import Capturer

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    channel = SimpleNamespace(capture_offer=False, capture=None)
    cfg = SimpleNamespace(rank=0, server="http://127.0.0.1:9", run_id="r", token="")
    cap = Capturer(SimpleNamespace(config=cfg), channel)  # type: ignore[arg-type]
    assert channel.capture_offer  # it offers on the channel's polls
    channel.capture = CaptureAsk(id=7, steps=20, warmup=1, ranks=(0,), from_step=20)
    model = torch.nn.Linear(16, 16)
    for n in (0, 10, 20, 30, 40):  # waits for step 20, then profiles
        cap.begin(n)
        model(torch.randn(4, 16)).sum().backward()
        cap.end(n)
    assert cap._prof is not None and cap.errors == 0
    cap.close(0.0)  # run.finish() in the middle of the capture
    assert cap._prof is None and cap.captured == 0
    assert not torch.autograd.profiler._is_profiler_enabled  # type: ignore[attr-defined]
    assert not list(tmp_path.glob("fleetlens-capture-*")), list(tmp_path.iterdir())
    cap.begin(50)  # asked once: the same capture is not started again
    assert cap._prof is None
