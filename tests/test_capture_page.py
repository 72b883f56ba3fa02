"""The run page's "Captured traces" section in a real browser (Debian's Chromium, Playwright):
a capture asked of two ranks, each answered with a real recorded GPU trace (HTA's
``trace_filter_world128`` sample, ranks 0 and 1), shows side by side, a column a rank, with the
figures the API returns, formatted as the page formats numbers; each rank's file downloads; a
finding's evidence line reads the capture; a run without captures says how to turn them on.
"""

from __future__ import annotations

import urllib.request
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest

from fleetlens.testing import Server, step_batch

pytestmark = pytest.mark.e2e
playwright = pytest.importorskip("playwright.sync_api")

RUN, BARE = "capture-page", "capture-none"
TRACES = Path(__file__).parent / "data/real/kineto_traces/hta/trace_filter_world128"


def fmt(v: float) -> str:
    """The page's number format (charts.js ``fmt``), as JavaScript rounds: the exact binary
    value, a tie away from zero."""

    def fixed(x: float, places: int) -> str:
        return str(Decimal(x).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP))

    a = abs(v)
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e4, "k")):
        if a >= scale:
            return fixed(v / (scale if suffix != "k" else 1e3), 1) + suffix
    if a >= 100:
        return fixed(v, 0)
    if a >= 1:
        return fixed(v, 2)
    return "0" if a == 0 else f"{v:.2g}"


def _put(srv: Server, path: str, body: bytes) -> int:
    req = urllib.request.Request(srv.url + path, data=body, method="PUT")
    req.add_header("Content-Type", "application/gzip")
    with urllib.request.urlopen(req, timeout=60) as r:
        return int(r.status)


def _cells(page: Any, capture: int, line: str) -> list[str]:
    row = page.locator(f"#capture-{capture} tbody tr", has=page.locator(f"th:text-is('{line}')"))
    return [c.strip() for c in row.locator("td").all_inner_texts()]


def test_a_capture_shows_its_ranks_side_by_side_with_the_apis_figures(
    server: Server, browser: Any
) -> None:
    for run in (RUN, BARE):
        assert server.post(step_batch(run, range(40), 4, job_id=f"{run}-j1")[1])[0] == 200
    status, asked = server.request(
        "POST", f"/v1/runs/{RUN}/traces/captures", {"ranks": [1, 0], "steps": 3}
    )
    assert status == 201, asked
    cid = asked["captureId"]
    files = {r: (TRACES / f"sampled_rank-{r}.json.gz").read_bytes() for r in (1, 0)}
    for rank, body in files.items():
        assert _put(server, f"/v1/runs/{RUN}/traces/captures/{cid}/{rank}", body) == 201
    (cap,) = server.get(f"/v1/runs/{RUN}/traces/captures")["captures"]
    assert cap["captureId"] == cid and cap["state"] == "done", cap
    ev = cap["evidence"]
    ranks = ev["ranks"]
    assert [r["rank"] for r in ranks] == [1, 0] and not any(r.get("missing") for r in ranks)

    page = browser.new_page(viewport={"width": 1440, "height": 900}, accept_downloads=True)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"{server.url}/runs/{RUN}")
        table = page.locator(f"#captures table#capture-{cid}")
        table.locator("tbody tr").first.wait_for(timeout=30_000)
        heads = [h.strip() for h in table.locator("thead th").all_inner_texts()]
        assert heads == ["Line", "rank 1 (named)", "rank 0 (named)"], heads
        heading = page.locator("#captures h3").first.inner_text()
        assert heading.startswith(f"Capture #{cid}: done · asked by ")
        assert f"steps {ev['fromStep']}–{ev['toStep']}" in heading, heading

        # Every figure is the API's, as the page formats numbers; a GPU trace has its idle.
        lines = {
            "Step (ms)": "stepMs",
            "Compute (ms)": "computeMs",
            "Exposed comm (ms)": "exposedCommMs",
            "Idle (ms)": "idleMs",
            "Memcpy (ms)": "memcpyMs",
        }
        for line, key in lines.items():
            assert _cells(page, cid, line) == [fmt(r[key]) for r in ranks], line
        assert all(r["hostOnly"] is False and r["kernels"] > 0 for r in ranks)
        assert _cells(page, cid, "Kernels") == [str(r["kernels"]) for r in ranks]
        assert _cells(page, cid, "Collectives") == [str(r["collectives"]) for r in ranks]
        kernels = _cells(page, cid, "Heaviest kernel")
        for r, got in zip(ranks, kernels, strict=True):
            top = r["topKernels"][0]
            assert top["name"] and got == f"{top['name']} · {fmt(top['totalMs'])} ms", got
        colls = _cells(page, cid, "Heaviest collective")
        for r, got in zip(ranks, colls, strict=True):
            top = r["topCollectives"][0]
            assert got == f"{top['op']} · {fmt(top['totalMs'])} ms", got

        # Each rank's file: Perfetto, and a download that is the bytes the rank sent.
        trace_row = table.locator("tbody tr", has=page.locator("th:text-is('Trace file')"))
        for i, rank in enumerate(r["rank"] for r in ranks):
            cell = trace_row.locator("td").nth(i)
            assert cell.get_by_role("button", name=f"Open rank {rank}'s trace in Perfetto").count()
            with page.expect_download() as got:
                cell.get_by_role("link", name=f"Download rank {rank}'s trace").click()
            assert Path(got.value.path()).read_bytes() == files[rank], rank

        # A finding's one-line evidence, as the findings tables show the capture's item.
        line = page.evaluate("(ev) => FLApp.evidence([ev])", ev)
        per = "; ".join(
            f"rank {r['rank']} compute {fmt(r['computeMs'])} ms, wait {fmt(r['exposedCommMs'])} ms"
            for r in ranks
        )
        assert line == f"trace capture steps {ev['fromStep']}–{ev['toStep']}: {per}", line
        waiting = {**ev, "state": "partial", "ranks": [ranks[0], {"rank": 0, "missing": True}]}
        assert page.evaluate("(ev) => FLApp.evidence([ev])", waiting).endswith(
            "; rank 0 not in yet"
        )

        # A run without captures says how to have them.
        page.goto(f"{server.url}/runs/{BARE}")
        note = page.locator("#captures-note", has_text="No captures.")
        note.wait_for(timeout=30_000)
        assert "FLEETLENS_TRACE_CAPTURE=1 (fleetlens.torch)" in note.inner_text()
        assert page.locator("#captures table").count() == 0
        assert errors == []
    finally:
        page.close()
