"""Time to result across a project's runs and its efficiency frontier (issue 39 item 6): the API
answer from runs of known step times and sizes, to a step target and to a loss target."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench._delivery import from_matrix
from fleetlens.sim.emit import encode
from fleetlens.testing import InProcessServer, Server

from .test_cli import fleetlens_cmd

pytestmark = pytest.mark.api  # the run page's test below is e2e (a server, Chromium)

T0 = 1.7e9
CONFIG = {"total_steps": 100}


def _post(
    srv: InProcessServer | Server, run: str, steps: int, world: int, step_s: float, t0: float
) -> None:
    rec = from_matrix(run, np.arange(steps), np.full((steps, world), step_s), t0, CONFIG)
    for ctx, tables in [*rec.first, *rec.other]:
        assert srv.post(encode(ctx, tables))[0] == 200
    for ctx, cols in rec.steps:
        assert srv.post(encode(ctx, {"step": (len(cols["step"]), cols)}))[0] == 200


def _loss(srv: InProcessServer, run: str, values: list[float], step_s: float, t0: float) -> None:
    n = len(values)
    cols = {"step": np.arange(n, dtype=np.int64), "time": t0 + step_s * (np.arange(n) + 1),
            "name": ["loss"] * n, "value": np.asarray(values, dtype=np.float64)}  # fmt: skip
    ctx = {"run_id": run, "job_id": f"{run}-a0", "project": "real"}
    assert srv.post(encode(ctx, {"scalar": (n, cols)}))[0] == 200


def test_time_to_result_and_the_frontier_of_a_projects_runs(tmp_path: Path) -> None:
    """Four runs to step 100: 4 devices at 0.2 s a step (20 s, the cheapest), 8 at 0.12 s (12 s,
    the fastest), 8 at 0.25 s (slower and dearer than both: off the frontier), and one still
    running at step 49, estimated at its pace."""
    with InProcessServer(str(tmp_path / "data")) as srv:
        _post(srv, "cheap", 100, 4, 0.2, T0)
        _post(srv, "fast", 100, 8, 0.12, T0 + 1000)
        _post(srv, "behind", 100, 8, 0.25, T0 + 2000)
        t_live = time.time() - 12.0
        _post(srv, "live", 50, 4, 0.2, t_live)
        asked = time.time()
        f = srv.get("/v1/projects/real/frontier")
        assert f["targetSteps"] == 100 and f["targetLoss"] is None
        runs = {r["runId"]: r for r in f["runs"]}
        assert [r["runId"] for r in f["runs"]][:2] == ["fast", "cheap"]
        assert runs["cheap"]["seconds"] == pytest.approx(20.0, abs=0.01)
        assert runs["cheap"]["gpuHours"] == pytest.approx(4 * 20.0 / 3600, rel=1e-3)
        assert runs["fast"]["seconds"] == pytest.approx(12.0, abs=0.01)
        assert runs["behind"]["seconds"] == pytest.approx(25.0, abs=0.01)
        assert runs["cheap"]["reachedStep"] == 99 and not runs["cheap"]["estimated"]
        on = {r["runId"] for r in f["runs"] if r["onFrontier"]}
        assert on == {"fast", "cheap"}  # behind: fast is sooner and cheaper
        live = runs["live"]
        assert live["status"] == "RUNNING" and live["estimated"]
        # from now, its 50 steps left at its 0.2 s pace
        assert live["seconds"] == pytest.approx(asked - t_live + 10.0, abs=1.0)
        # a target of its own: step 50, which the live run has reached too
        f50 = srv.get("/v1/projects/real/frontier?targetSteps=50")
        r50 = {r["runId"]: r for r in f50["runs"]}
        assert r50["cheap"]["seconds"] == pytest.approx(10.0, abs=0.01)
        assert not r50["live"]["estimated"] and r50["live"]["reachedStep"] == 49
        # a quality target: the first loss at or under 2.0, never extrapolated
        _loss(srv, "cheap", [3.0] * 60 + [1.9] * 40, 0.2, T0)
        _loss(srv, "fast", [3.0] * 80 + [1.5] * 20, 0.12, T0 + 1000)
        fl = srv.get("/v1/projects/real/frontier?targetLoss=2.0")
        rl = {r["runId"]: r for r in fl["runs"]}
        assert rl["cheap"]["reachedStep"] == 60 and rl["cheap"]["seconds"] == pytest.approx(12.2)
        assert rl["fast"]["reachedStep"] == 80 and rl["fast"]["seconds"] == pytest.approx(9.72)
        assert rl["behind"]["seconds"] is None and not rl["behind"]["onFrontier"]
        assert rl["live"]["seconds"] is None and not rl["live"]["estimated"]
        assert srv.request("GET", "/v1/projects/real/frontier?targetSteps=5&targetLoss=1")[0] == 400
        assert srv.request("GET", "/v1/projects/nothing-here/frontier")[0] == 404


@pytest.mark.e2e
def test_the_run_page_shows_the_run_among_its_projects_time_to_result(
    server: Server, browser: Any
) -> None:
    for run, world, step_s, t0 in (("cheap", 4, 0.2, T0), ("fast", 8, 0.12, T0 + 1000),
                                   ("behind", 8, 0.25, T0 + 2000)):  # fmt: skip
        _post(server, run, 100, world, step_s, t0)
    page = browser.new_page()
    try:
        page.goto(f"{server.url}/runs/behind")
        page.wait_for_selector("#frontier-sec:not([hidden]) #frontier tbody tr", timeout=60_000)
        rows = [
            [c.inner_text().strip() for c in tr.query_selector_all("th, td")]
            for tr in page.query_selector_all("#frontier tbody tr")
        ]
        assert [r[0] for r in rows] == ["fast", "cheap", "behind (this run)"]
        assert [r[5] for r in rows] == ["★", "★", ""]
        assert "target step 100: 2 of 3 runs on the frontier" in page.inner_text("#frontier-note")
    finally:
        page.close()
    # the same from the command line
    done = fleetlens_cmd("frontier", "real", "--server", server.url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "project real: time to step 100, fastest first (* on the frontier)"
    rows = [ln.split() for ln in lines[2:]]
    assert [r[:2] for r in rows[:2]] == [["*", "fast"], ["*", "cheap"]] and rows[2][0] == "behind"
    assert rows[1][2:6] == ["STALLED", "4", "20", "s"], rows[1]  # no finish event: stalled
