"""Runs known only from recordings (profiler traces), through the CLI into a real server and in
Chromium: RECORDED, not live and not stalled; their traces on the run and rank pages.

Before: a run made from 11 imported traces was listed STALLED with 0 ranks and goodput 0% (and
led on-call's live jobs, in red); its numbers appeared nowhere in the portal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetlens.testing import Server, step_batch

from .test_portal_run import _wide
from .test_traces import W16, W128, _cli

pytestmark = pytest.mark.e2e


def _import(server: Server, run: str, *paths: Path) -> None:
    assert _cli(["traces", "import", *map(str, paths), "--run", run, "--server", server.url]) == 0


def test_a_trace_only_run_is_recorded_not_live_until_live_data_come(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    _import(server, "tr-rec", W128)
    run = server.get("/v1/runs/tr-rec")
    # Its ranks and steps are the traces'; nothing live came, so it is neither running nor stalled.
    assert (run["status"], run["worldSize"], run["lastStep"]) == ("RECORDED", 2, 552), run
    listed = {r["runId"]: r for r in server.get("/v1/runs")["runs"]}
    assert listed["tr-rec"]["status"] == "RECORDED"
    only = server.get("/v1/portal/runs?status=RECORDED")
    assert [r["runId"] for r in only["runs"]] == ["tr-rec"], only
    oncall = server.get("/v1/portal/oncall")
    assert "tr-rec" not in [j["runId"] for j in oncall["jobs"]], oncall["jobs"]
    # The heaviest kernels and collectives of the two ranks, read back by the API and the CLI.
    doc = server.get("/v1/runs/tr-rec/traces?limit=1")
    top = doc["topKernels"][0]
    assert top["name"].startswith("ncclKernel_SendRecv") and top["category"] == "comm", top
    assert top["ranks"] == 2 and 25 < top["pctOfStepTime"] < 40, top
    assert doc["topKernels"] == sorted(doc["topKernels"], key=lambda k: -k["totalMs"])
    assert [c["op"] for c in doc["topCollectives"]][:3] == [
        "all_to_all",
        "all_gather",
        "all_reduce",
    ]
    capsys.readouterr()
    assert _cli(["traces", "show", "tr-rec", "--server", server.url]) == 0
    out = capsys.readouterr().out
    assert "heaviest kernels" in out and "ncclKernel_SendRecv" in out and "all_to_all" in out
    # A trace imported into a live run does not make it a recording, nor resize it ...
    ctx = {"run_id": "tr-live", "job_id": "tr-live-a0"}
    assert (
        server.post(step_batch("tr-live", range(0, 5), 8, job_id="tr-live-a0", ctx=ctx)[1])[0]
        == 200
    )
    _import(server, "tr-live", W16)
    live = server.get("/v1/runs/tr-live")
    assert (live["status"], live["worldSize"]) == ("RUNNING", 8), live
    # ... and live data of a recorded run make it live.
    ctx = {"run_id": "tr-rec", "job_id": "tr-rec-a0"}
    assert (
        server.post(step_batch("tr-rec", range(600, 605), 2, job_id="tr-rec-a0", ctx=ctx)[1])[0]
        == 200
    )
    assert server.get("/v1/runs/tr-rec")["status"] == "RUNNING"


def test_the_run_and_rank_pages_show_a_recorded_runs_traces(server: Server, browser: Any) -> None:
    _import(server, "tr-page", W128)
    page, errors = _wide(browser, f"{server.url}/runs/tr-page")
    assert page.is_visible("#traces")
    now = page.inner_text("#now")
    assert "RECORDED" in now and "Ranks\n2" in now.replace("\t", "\n"), now
    rows = page.locator("#trace-ranks tbody tr")
    assert rows.count() == 2
    api = {r["rank"]: r for r in server.get("/v1/runs/tr-page/traces?limit=1")["ranks"]}
    cells = rows.nth(0).locator("th, td").all_inner_texts()
    assert cells[0] == "0" and cells[3] == f"{api[0]['computePct']:.1f}%", cells
    assert "ncclKernel_SendRecv" in page.inner_text("#trace-kernels")
    assert "all_to_all" in page.inner_text("#trace-colls")
    assert "known only from recordings" in page.inner_text("#traces-note")
    # The rank's link opens its page, with its traced steps.
    rows.nth(1).locator("th a").click()
    page.wait_for_url("**/ranks/1")
    page.wait_for_selector("#rank-traces:not([hidden])")
    steps = page.locator("#rank-trace-steps tbody tr")
    assert steps.count() == 2 and "sampled_rank-1.json.gz" in steps.nth(0).inner_text()
    page.close()
    assert errors == []
    # A run without traces keeps the section hidden.
    ctx = {"run_id": "no-tr", "job_id": "no-tr-a0"}
    assert server.post(step_batch("no-tr", range(0, 5), 2, job_id="no-tr-a0", ctx=ctx)[1])[0] == 200
    page, errors = _wide(browser, f"{server.url}/runs/no-tr")
    assert page.is_hidden("#traces")
    page.close()
    assert errors == []
