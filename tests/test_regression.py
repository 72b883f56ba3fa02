"""Regression tiers (issue 39 item 2): a run slower than the earlier runs of its workload, on
the software they ran, is a finding and a ticket naming the version that changed.

The judgment on made-up figures, then three real runs of the DDP example under torchrun: two on
image ``train:1``, then one on ``train:2`` given a quarter of their CPU from outside (a cgroup
its launcher starts in), as a slower image or driver would make it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench._delivery import from_matrix
from bench._realjobs import _throttle, _unthrottle
from fleetlens.analysis.regression import RunFigures, judge, workload_key
from fleetlens.sim.emit import encode
from fleetlens.testing import InProcessServer, Server, wait_until

from .test_cli import fleetlens_cmd

EXAMPLE = Path(__file__).resolve().parents[1] / "fleetlens" / "examples" / "ddp_train.py"
ONE = {"image": "train:1", "torch": "2.13.0"}
TWO = {"image": "train:2", "torch": "2.13.0"}


def _run(i: int, sw: dict[str, str], step_s: float, startup_s: float = 5.0) -> RunFigures:
    return RunFigures(f"r{i}", float(i), dict(sw), step_s, startup_s, steps=100)


@pytest.mark.unit
def test_a_run_is_judged_on_the_software_it_followed_and_names_what_changed() -> None:
    base = [_run(1, ONE, 0.100), _run(2, ONE, 0.104), _run(3, ONE, 0.098)]
    (prog, start) = judge(_run(4, TWO, 0.130), base)
    assert (prog.tier, prog.worse, prog.baseline) == ("program", True, 0.1)
    assert prog.runs == ["r1", "r2", "r3"]
    assert prog.changes == ["image train:1 vs train:2"] and prog.ratio == pytest.approx(1.3)
    assert start.tier == "startup" and not start.worse
    # Within the tolerance (10%) and the baseline's own spread: not worse.
    assert not judge(_run(4, TWO, 0.108), base)[0].worse
    # The baseline is the software of the newest earlier run: after train:2 came in, a third
    # train:2 run is judged against the train:2 runs, and nothing changed.
    later = [*base, _run(4, TWO, 0.130), _run(5, TWO, 0.131)]
    (again, _) = judge(_run(6, TWO, 0.132), later)
    assert not again.worse and again.runs == ["r4", "r5"] and again.changes == []
    # One earlier run is no baseline; a later run is not one; a run is not its own.
    assert judge(_run(2, ONE, 0.2), [_run(1, ONE, 0.1)]) == []
    assert judge(_run(1, ONE, 0.2), [_run(2, ONE, 0.1), _run(3, ONE, 0.1)]) == []


@pytest.mark.unit
def test_the_workload_is_the_configs_model_keys_and_the_world_not_its_versions() -> None:
    cfg = {"model": "tiny-lm", "seq_len": 64, "lr": 3e-3, "software_version": "1"}
    assert workload_key(cfg, 4) == workload_key({**cfg, "software_version": "2", "lr": 1.0}, 4)
    assert workload_key(cfg, 4) != workload_key(cfg, 8)
    assert workload_key(cfg, 4) != workload_key({**cfg, "seq_len": 128}, 4)
    assert workload_key({"lr": 3e-3}, 4) is None  # the world size alone names no workload
    assert workload_key({"dtype": "bf16", "seq_len": 64}, 4) is None  # nor a dtype: no model


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(str(tmp_path / "data"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "0.5"}).start()
    try:
        yield srv
    finally:
        srv.stop()


def _train(srv: Server, run: str, image: str, tmp: Path, cores: float | None = None) -> None:
    """The example under torchrun, 60 steps; with ``cores``, the launcher and its ranks are
    capped at that many CPUs from outside (a cgroup made before it starts, which its ranks
    inherit)."""
    env = {
        **os.environ,
        "FLEETLENS_SERVER": srv.url,
        "FLEETLENS_RUN_ID": run,
        "FLEETLENS_IMAGE": image,
        "FLEETLENS_RELAY": "off",
        "OMP_NUM_THREADS": "1",
    }
    args = [str(EXAMPLE), "--steps", "60", "--stats-dir", str(tmp)]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              "--nproc-per-node", "4", *args]  # fmt: skip
    # The shell waits for a line on stdin, so that it is in the cgroup before torchrun starts.
    job = subprocess.Popen(["sh", "-c", 'read go; exec "$@"', "sh", *launch], env=env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)  # fmt: skip
    cg = None
    try:
        if cores is not None:
            cg = _throttle(job.pid, cores)
            assert cg is not None, "no cgroup with a cpu controller to cap the job with"
        _, err = job.communicate("go\n", timeout=600)
        assert job.returncode == 0, err[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
        if cg is not None:
            _unthrottle(cg)


@pytest.mark.e2e
def test_a_new_image_slower_than_its_workloads_runs_is_a_finding_and_a_ticket(
    server: Server, tmp_path: Path
) -> None:
    # Every run capped from outside, so that what the machine's other work leaves them does
    # not decide the figures: 1.2 CPUs for the baseline's, a quarter of that for the new image.
    for run in ("reg-a", "reg-b"):
        _train(server, run, "train:1", tmp_path, cores=1.2)
    _train(server, "reg-c", "train:2", tmp_path, cores=0.3)

    def regressed() -> list[dict[str, Any]]:
        found = server.get("/v1/runs/reg-c/diagnosis")["findings"]
        return [f for f in found if f["diagnosis"] == "program_regression"]

    try:
        (finding,) = wait_until(regressed, timeout=120)
    except AssertionError:
        raise AssertionError(server.get("/v1/runs/reg-c/regression")) from None
    assert finding["owner"] == "infrastructure" and finding["kind"] == "regression", finding
    assert "coincides with image train:1 vs train:2" in finding["summary"], finding
    (ev,) = finding["evidence"]
    assert ev["baselineRuns"] == ["reg-a", "reg-b"] and ev["value"] > 2 * ev["baseline"], ev
    doc = server.get("/v1/runs/reg-c/regression")
    (prog,) = [v for v in doc["verdicts"] if v["tier"] == "program"]
    assert prog["worse"] and prog["changes"] == ["image train:1 vs train:2"], doc
    assert doc["figures"]["software"]["image"] == "train:2", doc
    # The runs on the baseline's image are not worse (reg-b against reg-a alone: no baseline).
    assert server.get("/v1/runs/reg-b/regression")["verdicts"] == []
    assert not [f for f in server.get("/v1/runs/reg-b/diagnosis")["findings"]
                if f["kind"] == "regression"]  # fmt: skip
    # A ticket for the platform's on-call, and the command line says the same.
    alerts = wait_until(
        lambda: [
            a
            for a in server.get("/v1/alerts?runId=reg-c")["alerts"]
            if a["alertname"] == "PerformanceRegression"
        ],
        timeout=60,
    )
    assert alerts[0]["severity"] == "ticket", alerts
    shown = fleetlens_cmd("regression", "reg-c", "--server", server.url)
    assert shown.returncode == 0, shown.stderr
    assert "WORSE" in shown.stdout and "changed: image train:1 vs train:2" in shown.stdout
    contract = server.get("/v1/runs/reg-c")["contract"]
    assert contract["software"]["image"] == "train:2", contract


def _post_run(srv: InProcessServer, run: str, step_s: float, steps: range, t0: float) -> None:
    compute = np.full((len(steps), 4), step_s)
    rec = from_matrix(run, np.array(list(steps)), compute, t0, {"model": "tiny-lm"})
    for ctx, tables in [*rec.first, *rec.other]:
        assert srv.post(encode(ctx, tables))[0] == 200
    for ctx, cols in rec.steps:
        assert srv.post(encode(ctx, {"step": (len(cols["step"]), cols)}))[0] == 200


@pytest.mark.api
def test_a_run_no_longer_worse_than_its_baseline_ends_its_finding(tmp_path: Path) -> None:
    """Run c's first 60 steps take 0.5 s against its two predecessors' 0.2 s: a finding, open
    while the run is. Its next 200 steps take 0.2 s: the median is back, the finding ends."""
    settings = {"analysis_interval_s": 0.2, "regression_every_s": 0.5}
    with InProcessServer(str(tmp_path / "data"), settings=settings) as srv:
        t0 = time.time() - 3600
        for i, run in enumerate(("c-a", "c-b")):
            _post_run(srv, run, 0.2, range(60), t0 + 100 * i)
        _post_run(srv, "c-c", 0.5, range(60), t0 + 300)

        def finding() -> dict[str, Any] | None:
            found = srv.get("/v1/runs/c-c/diagnosis")["findings"]
            got = [f for f in found if f["diagnosis"] == "program_regression"]
            return got[0] if got else None

        f = wait_until(finding, timeout=60)
        assert f["endStep"] is None and f["evidence"][0]["baselineRuns"] == ["c-a", "c-b"], f
        _post_run(srv, "c-c", 0.2, range(60, 260), t0 + 400)
        ended = wait_until(lambda: (g := finding()) and g["endStep"] is not None and g, 60)
        assert ended["endStep"] == 259 and ended["evidence"] == f["evidence"], ended
        verdicts = srv.get("/v1/runs/c-c/regression")["verdicts"]
        (prog,) = [v for v in verdicts if v["tier"] == "program"]
        assert not prog["worse"] and prog["value"] == pytest.approx(0.2), prog
