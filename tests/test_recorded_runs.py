"""Runs known only from recordings (profiler traces), through the CLI into a real server and in
Chromium: RECORDED, not live and not stalled; their traces on the run and rank pages.

Before: a run made from 11 imported traces was listed STALLED with 0 ranks and goodput 0% (and
led on-call's live jobs, in red); its numbers appeared nowhere in the portal.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetlens.errors import FleetlensError
from fleetlens.testing import Server, step_batch
from fleetlens.traces.files import TraceFiles

from .test_portal_run import _wide
from .test_traces import W16, W128, _cli

pytestmark = pytest.mark.e2e


def _import(server: Server, run: str, *args: Path | str) -> None:
    assert _cli(["traces", "import", *map(str, args), "--run", run, "--server", server.url]) == 0


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


# Perfetto's side of its postMessage protocol, as its UI answers: PONG to a PING, then the trace.
# The test's Chromium reaches no network, so this page stands in for ui.perfetto.dev.
_PERFETTO = """<!doctype html><title>Perfetto stand-in</title><script>
window.addEventListener("message", (e) => {
  if (e.data === "PING") { e.source.postMessage("PONG", e.origin); return; }
  const p = e.data && e.data.perfetto;
  if (p) document.title = `got ${p.buffer.byteLength} ${p.title} ${p.fileName}`;
});
</script>"""


def test_trace_files_are_kept_whole_and_served_back(server: Server) -> None:
    assert (
        _cli(
            [
                "traces",
                "import",
                str(W128),
                "--run",
                "tr-f",
                "--server",
                server.url,
                "--upload-files",
            ]
        )
        == 0
    )
    sizes = {r["rank"]: r["fileBytes"] for r in server.get("/v1/runs/tr-f/traces")["ranks"]}
    for rank, name in ((0, "sampled_rank-0.json.gz"), (1, "sampled_rank-1.json.gz")):
        raw = (W128 / name).read_bytes()
        assert sizes[rank] == len(raw)
        got = httpx.get(f"{server.url}/v1/runs/tr-f/traces/files/{rank}")
        assert got.status_code == 200 and got.content == raw
        assert got.headers["content-type"] == "application/gzip"
    # Refusals keep nothing: not gzip, an unknown run, a rank with no file.
    files = f"{server.url}/v1/runs/tr-f/traces/files"
    assert httpx.put(f"{files}/5", content=b'{"traceEvents": []}').status_code == 415
    assert httpx.get(f"{files}/5").status_code == 404
    nope = f"{server.url}/v1/runs/nope/traces/files/0"
    assert httpx.put(nope, content=b"\x1f\x8b\x08").status_code == 404
    assert sorted(TraceFiles(server.data_dir).sizes("default", "tr-f")) == [0, 1]


def test_the_run_and_rank_pages_show_a_recorded_runs_traces(server: Server, browser: Any) -> None:
    _import(server, "tr-page", W128, "--upload-files")
    page, errors = _wide(browser, f"{server.url}/runs/tr-page")
    page.context.route(
        "https://ui.perfetto.dev/**",
        lambda route: route.fulfill(status=200, content_type="text/html", body=_PERFETTO),
    )
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
    # "Open in Perfetto" posts the rank's kept file to Perfetto's UI, whole.
    with page.expect_popup() as popup:
        rows.nth(1).get_by_role("button", name="Open rank 1's trace in Perfetto").click()
    size = (W128 / "sampled_rank-1.json.gz").stat().st_size
    popup.value.wait_for_function(f"document.title.startsWith('got {size} ')")
    assert popup.value.title() == f"got {size} tr-page rank 1 tr-page-rank1.json.gz"
    popup.value.close()
    assert "sent to Perfetto" in page.inner_text("#traces-open")
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


def test_a_trace_file_over_the_limit_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    """Streamed to disk: refused as soon as it passes collector.max_trace_file_bytes, with no
    part of it left behind; the CLI names the limit."""
    limit = 100_000
    srv = Server(str(tmp_path / "data"), env={"FLEETLENS_MAX_TRACE_FILE_BYTES": str(limit)})
    srv.start()
    try:
        _import(srv, "tr-big", W128)
        url = f"{srv.url}/v1/runs/tr-big/traces/files/0"

        def chunked() -> Iterator[bytes]:  # no Content-Length: refused while it streams
            yield b"\x1f\x8b" + b"x" * 60_000
            yield from (b"y" * 60_000 for _ in range(5))

        r = httpx.put(url, content=chunked())
        assert r.status_code == 413 and "max_trace_file_bytes" in r.json()["detail"]
        kept = list((tmp_path / "data" / "trace_files").rglob("*"))
        assert [p for p in kept if p.is_file()] == []
        with pytest.raises(FleetlensError, match="the limit is 100000"):
            _import(srv, "tr-big", W128, "--upload-files")
        assert httpx.get(url).status_code == 404
    finally:
        srv.stop()
