"""The run page's interactions in a real browser (Debian's Chromium, Playwright): "What's wrong"
above the fold with each finding's cost, hover values on every chart, a brushed step range that
every chart and table follows and the URL keeps over a reload, the heatmap's hover, keyboard and
click-through to a rank page, and refreshing that survives a 503 (with backoff), skips the
heatmap below the fold, pauses, and keeps a STALLED run and the runs list live. No console
error and no request off the server (uPlot is vendored).
``FLEETLENS_SCREENSHOTS=DIR`` saves the run (above the fold) and rank pages.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from fleetlens.api.portal_fleet_models import OnCallOut, PortalCapacityOut, PortalRunsOut
from fleetlens.api.portal_models import FailurePageOut, HeatmapOut, OverviewOut, RankDetailOut
from fleetlens.testing import Server, step_batch, wait_passes
from fleetlens.wire import TableBuilder, encode_batch

from . import test_portal as base

pytestmark = pytest.mark.e2e

RUN = base.RUN
playwright = base.playwright
# The portal tests' played server (the demo run in it); Chromium is conftest's ``browser``.
played = base.played
pytestmark = base.pytestmark

WIDE = {"width": 1440, "height": 900}


@pytest.fixture(scope="module", autouse=True)
def settled(played: Server) -> None:
    """The analysis loop goes on after the fixture saw its first findings (the thermal and data
    stall ones, windows growing): wait until two reads two monitoring passes apart rank the same
    findings with the same costs, so that a page and the API read after it agree."""

    def ranking() -> list[tuple[str, int, Any, float]]:
        doc = played.get(f"/v1/runs/{RUN}/overview")
        return [
            (f["key"], f["startStep"], f["endStep"], round(f["cost"]["totalSeconds"], 3))
            for f in doc["findings"]
        ]

    deadline = time.monotonic() + 60
    last = ranking()
    while True:
        wait_passes(played, 2)
        now = ranking()
        if now == last and len(now) >= 4:
            return
        assert time.monotonic() < deadline, now
        last = now


def _wide(browser: Any, url: str, name: str | None = None) -> tuple[Any, list[str]]:
    """A page at 1440 x 900, loaded, with its console errors (``_open``'s checks)."""
    page = browser.new_page(viewport=WIDE)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: errors.append(f"failed {r.url}"))
    # Nothing but the server: uPlot is served by it, no CDN.
    home = url.split("/", 3)[:3]
    page.on(
        "request",
        lambda r: None if r.url.split("/", 3)[:3] == home else errors.append(f"off-host {r.url}"),
    )
    page.goto(url)
    page.wait_for_selector("body[data-loaded]", timeout=30_000)
    assert page.get_attribute("body", "data-loaded") == "true", page.inner_text("#status")
    shots = os.environ.get("FLEETLENS_SCREENSHOTS")
    if shots and name:
        os.makedirs(shots, exist_ok=True)
        page.screenshot(path=os.path.join(shots, f"{name}.png"))
    return page, errors


def test_whats_wrong_is_above_the_fold_with_each_findings_cost(
    played: Server, browser: Any
) -> None:
    page, errors = _wide(browser, f"{played.url}/runs/{RUN}", "run-fold")
    assert errors == []
    doc = played.get(f"/v1/runs/{RUN}/overview")
    rows = page.locator("#wrong-table tbody tr")
    assert rows.count() == min(5, len(doc["findings"])) >= 3
    # Above the fold: every row's bottom within the first 900 pixels.
    for i in range(rows.count()):
        box = rows.nth(i).bounding_box()
        assert box is not None and box["y"] + box["height"] <= 900, i
    # Most costly first: the fatal Xid's recovery and rework, then the straggler's slow steps.
    (strag,) = [f for f in doc["findings"] if f["diagnosis"] == "straggler.persistent"]
    row = page.locator("#wrong-table tbody tr:has([data-code='straggler.persistent'])")
    cells = [c.strip() for c in row.locator("th, td").all_inner_texts()]
    assert cells[0] == str(strag["rank"])
    assert cells[2] == "rank 37 · node-0004 · GPU 5"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC · step 300", cells[3]), cells[3]
    assert cells[4] == "80.0%" and cells[5] == "infrastructure"
    assert cells[6].startswith("compute / step median")
    points = strag["cost"]["goodputPoints"]
    assert cells[7] == f"{strag['cost']['gpuHours']:.2f} GPU-h · {points:.1f} pts"
    assert strag["cost"]["seconds"].keys() == {"straggler"}
    # The links: to the finding's evidence below and to the action on its node.
    # The finding reads as its plain name, its code in the tooltip.
    name = row.get_by_role("link", name="Slow rank (every step)")
    assert name.get_attribute("title") == "straggler.persistent"
    evidence = name.get_attribute("href")
    assert page.locator(f"#findings tbody tr{evidence}").inner_text().startswith("Slow rank")
    action = row.get_by_role("link", name=re.compile(r"^action #\d+")).get_attribute("href")
    assert "node-0004" in page.locator(f"#remediations tbody tr{action}").inner_text()
    first = [c.strip() for c in rows.first.locator("th, td").all_inner_texts()]
    assert first[1] == "GPU failure (fatal Xid)" and "node-0018" in first[2]
    assert "findings plus unexplained add up to them" in page.inner_text("#wrong-note")
    # Below it, the what-if (GET .../whatif/stragglers): how much faster with everything at its
    # peers' median, and with each slow worker fixed.
    w = played.get(f"/v1/runs/{RUN}/whatif/stragglers")
    assert w["slowdown"] > 0 and w["findings"], w
    page.wait_for_function("document.getElementById('whatif-note').textContent.length > 0")
    note = page.inner_text("#whatif-note")
    assert f"would run {w['slowdown'] * 100:.1f}% faster" in note, note
    fix = w["findings"][0]
    assert f"Slow rank (every step) (ranks {fix['ranks'][0]}" in note, note
    assert f"{fix['speedup'] * 100:.1f}% faster" in note, note


def test_findings_costs_add_up_to_the_breakdowns_loss_lines(played: Server) -> None:
    doc = played.get(f"/v1/runs/{RUN}/overview")
    lines = {li["category"]: li["seconds"] for li in doc["goodput"]["breakdown"]["lines"]}
    parts = [f["cost"] for f in doc["findings"]] + [doc["goodput"]["unattributed"]]
    for line, seconds in lines.items():
        if line == "productive":
            continue
        got = sum(p["seconds"].get(line, 0.0) for p in parts)
        assert got == pytest.approx(seconds, abs=0.01), line
    assert [f["rank"] for f in doc["findings"]] == list(range(1, len(doc["findings"]) + 1))
    costs = [f["cost"]["totalSeconds"] for f in doc["findings"]]
    assert costs == sorted(costs, reverse=True)
    wall = doc["goodput"]["breakdown"]["wallSeconds"]
    for p in parts:
        assert p["goodputPoints"] == pytest.approx(100 * p["totalSeconds"] / wall)
        assert p["gpuHours"] == pytest.approx(p["totalSeconds"] * 256 / 3600)


def _legend_values(page: Any, chart: str) -> list[str]:
    return [v.strip() for v in page.locator(f"#{chart} .u-legend .u-value").all_inner_texts()]


def _axis_labels(page: Any, chart: str) -> list[str]:
    """The axes' labels (uPlot draws them on its canvas)."""
    return list(page.evaluate(f"document.getElementById('{chart}')._flPlot.axes.map(a => a.label)"))


def test_hovering_a_chart_shows_values_on_every_chart_at_that_step(
    played: Server, browser: Any
) -> None:
    page, errors = _wide(browser, f"{played.url}/runs/{RUN}")
    assert errors == []
    for chart in ("step", "goodput", "loss", "lr", "grad_norm", "tps"):
        host = page.locator(f"#chart-{chart}")
        assert host.locator("canvas").count() >= 1, chart
        assert host.get_attribute("aria-label"), chart
        assert set(_legend_values(page, f"chart-{chart}")) == {"–"}, chart  # nothing hovered
    assert _axis_labels(page, "chart-step") == ["Step", "Step time (ms)"]
    assert _axis_labels(page, "chart-goodput") == ["Step", "Goodput (%)"]
    over = page.locator("#chart-step .u-over")
    over.scroll_into_view_if_needed()
    box = over.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    step = _legend_values(page, "chart-step")
    assert re.fullmatch(r"1\d{3}", step[0]), step  # the step under the cursor, mid-run
    assert all(v.endswith(" ms") for v in step[1:]), step
    # The crosshair is shared: the other charts show their values at the same step.
    assert _legend_values(page, "chart-goodput")[0] == step[0]
    assert _legend_values(page, "chart-goodput")[1].endswith(" %")
    assert _legend_values(page, "chart-loss")[0] != "–"
    # Wall-clock axis, labelled UTC; log scale and smoothing redraw without a fetch.
    page.select_option("#x-mode", "utc")
    assert _axis_labels(page, "chart-step") == ["Wall clock (UTC)", "Step time (ms)"]
    page.check("#log-y")
    page.select_option("#smooth", "5")
    q = parse_qs(urlparse(page.url).query)
    assert q == {"x": ["utc"], "log": ["1"], "smooth": ["5"]}
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    assert " UTC" in _legend_values(page, "chart-step")[0]
    # A resized window redraws the charts at the new width.
    before = page.locator("#chart-step canvas").first.bounding_box()["width"]
    page.set_viewport_size({"width": 900, "height": 900})
    width = "document.querySelector('#chart-step canvas').getBoundingClientRect().width"
    page.wait_for_function(f"() => {width} < {before - 200}")
    assert errors == []


def test_brushing_a_step_range_zooms_charts_and_tables_and_a_reload_keeps_it(
    played: Server, browser: Any
) -> None:
    page, errors = _wide(browser, f"{played.url}/runs/{RUN}")
    over = page.locator("#chart-step .u-over")
    over.scroll_into_view_if_needed()
    box = over.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.25, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.45, y, steps=5)
    page.mouse.up()
    page.wait_for_url(re.compile(r"fromStep=\d+&toStep=\d+"))
    page.wait_for_selector("body[data-loaded=true]")
    q = parse_qs(urlparse(page.url).query)
    lo, hi = int(q["fromStep"][0]), int(q["toStep"][0])
    assert 500 <= lo < hi <= 1200, (lo, hi)

    def follows() -> None:
        playwright.expect(page.locator("#range-text")).to_have_text(f"Steps {lo}–{hi} (zoomed)")
        playwright.expect(page.locator("#heat-caption")).to_contain_text(f"Steps {lo}–{hi}.")
        steps = [int(s) for s in page.locator("#timeline tbody th").all_inner_texts() if s != "–"]
        assert steps and all(lo <= s <= hi for s in steps), steps
        assert page.locator("#findings [data-code=thermal]").count()  # 605-1003 overlaps
        assert not page.locator("#findings [data-code=data_stall]").count()  # 2000-2099 not
        # The step chart's x axis now spans the range only.
        page.mouse.move(box["x"] + 2, y)
        assert lo <= int(_legend_values(page, "chart-step")[0]) <= lo + (hi - lo) // 10

    follows()
    page.reload()
    page.wait_for_selector("body[data-loaded=true]")
    assert parse_qs(urlparse(page.url).query) == {"fromStep": [str(lo)], "toStep": [str(hi)]}
    follows()
    page.get_by_role("button", name="Show all steps").click()
    playwright.expect(page.locator("#range-text")).to_have_text("All steps")
    assert "fromStep" not in page.url
    assert errors == []


def test_heatmap_hover_names_the_cell_and_a_click_opens_the_ranks_page(
    played: Server, browser: Any
) -> None:
    page, errors = _wide(browser, f"{played.url}/runs/{RUN}")
    canvas = page.locator("#heatmap")
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    # 256 rows of one rank under an 8 px top margin; the plot starts 58 px in.
    cell = page.evaluate("document.getElementById('heatmap')._flGeo.cellH")
    x, y = box["x"] + 58 + 300, box["y"] + 8 + (37 + 0.5) * cell
    page.mouse.move(x, y)
    tip = page.locator("#heat-tip")
    playwright.expect(tip).to_be_visible()
    text = tip.inner_text()
    assert text.startswith("rank 37 on node-0004 GPU 5 · steps "), text
    assert re.search(r"\d+(\.\d+)? ms compute \(1\.\d\d× the column median\)", text), text
    assert page.locator("#heat-hot").get_attribute("data-rank") == "37"
    # By keyboard: the first arrow lands on the outlined row, the next ones move; each cell is
    # described in the tip and to screen readers.
    canvas.focus()
    page.keyboard.press("ArrowLeft")
    assert tip.inner_text().startswith("rank 37 on node-0004 GPU 5 · steps ")
    page.keyboard.press("ArrowDown")
    assert tip.inner_text().startswith("rank 38 ")
    assert page.inner_text("#heat-cell") == tip.inner_text()
    page.keyboard.press("ArrowUp")
    page.mouse.click(x, y)
    page.wait_for_url(f"**/runs/{RUN}/ranks/37")
    page.wait_for_selector("body[data-loaded]")
    assert page.get_attribute("body", "data-loaded") == "true", page.inner_text("#status")
    assert page.inner_text("#rank-where").startswith("Rank 37 ran on node-0004 GPU 5")
    assert "node-0004" in page.inner_text("#placements")
    for chart in ("phases", "clock", "temp", "power", "mem", "xid"):
        assert page.locator(f"#chart-{chart} canvas").count() >= 1, chart
    names = page.locator("#chart-phases .u-legend th").all_inner_texts()
    assert {"compute", "mean rank compute", "comm wait", "data wait"} <= {n.strip() for n in names}
    shots = os.environ.get("FLEETLENS_SCREENSHOTS")
    if shots:
        page.screenshot(path=os.path.join(shots, "rank.png"), full_page=True)
    assert errors == []


def test_an_unknown_run_is_an_html_404_page(played: Server, browser: Any) -> None:
    page = browser.new_page(viewport=WIDE)
    response = page.goto(f"{played.url}/runs/no-such-run")
    assert response.status == 404
    assert response.headers["content-type"].startswith("text/html")
    assert page.get_by_role("heading", name="No such run").is_visible()
    assert "run 'no-such-run' does not exist" in page.inner_text("main")
    assert page.get_by_role("link", name="runs list").get_attribute("href") == "/"


LIVE = "stalled-run"


def _value(page: Any, name: str) -> Any:
    """The value of the "Now" card named ``name``."""
    dt = page.locator("dt", has_text=re.compile(f"^{re.escape(name)}$"))
    return page.locator("#now dl > div", has=dt).locator("dd")


def _card(page: Any, name: str) -> str:
    return str(_value(page, name).inner_text())


def test_a_stalled_runs_page_refreshes_through_a_503_and_pauses(
    played: Server, browser: Any
) -> None:
    old = time.time() - 1000  # no data for 1,000 s: STALLED
    assert played.post(step_batch(LIVE, range(0, 20), 4, t0=old)[1])[0] == 200
    deadline = time.monotonic() + 30
    while played.get(f"/v1/runs/{LIVE}")["status"] != "STALLED":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    page, _ = _wide(browser, f"{played.url}/runs/{LIVE}?refresh=1")
    assert _card(page, "Status") == "STALLED" and _card(page, "Step") == "19"
    playwright.expect(page.locator("#pause")).to_be_visible()
    playwright.expect(page.locator("#age")).to_contain_text("live, every 1 s")

    # The server answers 503 for a while: the page keeps its data, says so, and backs off.
    overview: list[float] = []
    page.on(
        "request", lambda r: overview.append(time.monotonic()) if "/overview" in r.url else None
    )
    page.route("**/overview*", lambda route: route.fulfill(status=503, body='{"detail":"down"}'))
    playwright.expect(page.locator("#status")).to_contain_text("Could not refresh")
    assert page.get_attribute("body", "data-stale") == "true"
    assert _card(page, "Step") == "19"
    deadline = time.monotonic() + 30  # two retries (the page's events come while it waits)
    while len(overview) < 3 and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    gaps = [b - a for a, b in itertools.pairwise(overview)]
    assert gaps and gaps[-1] >= 0.9, gaps  # retries 1 s apart at least, not in a loop
    # The server is back, with new steps: the next retry (within a second) shows them.
    assert played.post(step_batch(LIVE, range(20, 40), 4, t0=time.time() - 20)[1])[0] == 200
    page.unroute("**/overview*")
    playwright.expect(_value(page, "Step")).to_have_text("39")
    assert page.get_attribute("body", "data-stale") is None
    playwright.expect(page.locator("#status")).to_contain_text("Updated")
    # The heatmap, below the fold, was fetched once; scrolled into view, it is refreshed.
    assert page.get_attribute("body", "data-heat-fetches") == "1"
    page.locator("#heat").scroll_into_view_if_needed()
    page.wait_for_function("() => Number(document.body.dataset.heatFetches) >= 2")
    # Paused: no more requests until resumed.
    page.get_by_role("button", name="Pause updates").click()
    playwright.expect(page.locator("#age")).to_contain_text("paused")
    n = len(overview)
    page.wait_for_timeout(2500)
    assert len(overview) <= n + 1  # at most one already in flight
    page.get_by_role("button", name="Resume updates").click()
    deadline = time.monotonic() + 20
    while len(overview) <= n + 1:
        assert time.monotonic() < deadline
        page.wait_for_timeout(200)


def test_the_runs_list_refreshes(played: Server, browser: Any) -> None:
    page, errors = _wide(browser, f"{played.url}/?refresh=1")
    assert "fresh-run" not in page.inner_text("#runs")
    assert played.post(step_batch("fresh-run", range(0, 5), 2)[1])[0] == 200
    playwright.expect(page.locator("#runs")).to_contain_text("fresh-run", timeout=15_000)
    assert errors == []


def test_rank_detail_has_its_phases_and_each_placements_gpu_samples(played: Server) -> None:
    """Rank 150's GPU fell off the bus (Xid 79 on node-0018 GPU 6); the restart placed it on a
    spare: two placements, the Xid in the first one's samples only."""
    d = played.get(f"/v1/runs/{RUN}/ranks/150/detail?points=50")
    assert d["fromStep"] == 0 and d["toStep"] == 2399
    first, second = d["placements"]
    assert (first["node"], first["gpu"]) == ("node-0018", 6) and second["node"] != "node-0018"
    assert 79 in {s["xid"] for s in first["samples"]}
    assert {s["xid"] for s in second["samples"]} == {0}
    assert all(s["temp"] and s["smClockMax"] for s in first["samples"][:3])
    phases = d["phases"]
    assert 40 <= len(phases) <= 50 and phases[0]["step"] == 0
    assert all(p["compute"] and p["computeMean"] and p["duration"] >= p["compute"] for p in phases)
    window = played.get(f"/v1/runs/{RUN}/ranks/37/detail?fromStep=600&toStep=699&points=10")
    assert [p["step"] for p in window["phases"]] == list(range(600, 700, 10))
    assert played.request("GET", f"/v1/runs/{RUN}/ranks/37/detail?fromStep=9&toStep=1")[0] == 400


def test_rank_detail_of_a_run_without_placements(server: Server) -> None:
    """A run whose SDK sent no placement (found by the API fuzzer: a 500)."""
    _, body = step_batch("unplaced", range(0, 10), 2)
    assert server.post(body)[0] == 200
    d = server.get("/v1/runs/unplaced/ranks/1/detail?points=300")
    assert d["placements"] == [] and d["phases"] and d["fromStep"] == 0


def test_any_logged_metric_can_be_charted_and_the_pick_is_kept_in_the_url(
    played: Server, browser: Any
) -> None:
    metrics = played.get(f"/v1/runs/{RUN}/metrics")["metrics"]
    names = [m["name"] for m in metrics]
    other = max(metrics, key=lambda m: (m["points"], m["name"]))["name"]
    page, errors = _wide(browser, f"{played.url}/runs/{RUN}")
    page.wait_for_selector(f"#pick-metric option[value='{other}']", state="attached")
    assert sorted(
        page.eval_on_selector_all("#pick-metric option", "os => os.map(o => o.value)")
    ) == sorted(["", *names])
    assert page.locator("#chart-pick").is_hidden()
    page.select_option("#pick-metric", other)
    page.wait_for_selector(f"#chart-pick[data-metric='{other}'] canvas")
    assert f"metric={other}" in page.url
    assert other in (page.get_attribute("#chart-pick", "aria-label") or "")
    page.reload()
    page.wait_for_selector(f"#chart-pick[data-metric='{other}'] canvas")
    assert page.input_value("#pick-metric") == other
    assert errors == []


def test_the_portals_documents_are_what_their_response_models_declare(played: Server) -> None:
    """The overview and the heatmap are sent by msgspec (FastAPI does not validate them): real
    answers, the run's and its zoomed window's, with and without the slowest ranks, must be
    what /openapi.json documents, keys and types (the models refuse undeclared keys)."""
    for query in ("", "?points=50&fromStep=600&toStep=699"):
        doc = played.get(f"/v1/runs/{RUN}/overview{query}")
        out = OverviewOut.model_validate(doc)
        assert out.findings and out.remediations and out.alerts and (out.timeline or query)
        assert out.goodput is not None and out.step_series and out.scalars
    for query in ("", "?slowest=3", "?fromStep=300&toStep=1799&ranks=16&steps=50"):
        h = HeatmapOut.model_validate(played.get(f"/v1/runs/{RUN}/heatmap{query}"))
        assert h.cells and h.row_ranks is not None
        assert (h.slowest_ranks is not None) == ("slowest" in query)
    # Those FastAPI validates on the way out; checked here against the same models.
    RankDetailOut.model_validate(played.get(f"/v1/runs/{RUN}/ranks/150/detail?points=50"))
    failure = FailurePageOut.model_validate(played.get(f"/v1/runs/{RUN}/failure"))
    assert failure.failure is not None and failure.cause is not None and failure.related
    oncall = OnCallOut.model_validate(played.get("/v1/portal/oncall"))
    assert oncall.view == "tenant" and oncall.jobs is not None and oncall.remediations
    PortalCapacityOut.model_validate(played.get("/v1/portal/capacity"))
    PortalRunsOut.model_validate(played.get("/v1/portal/runs?sort=goodput"))


def test_a_run_without_steps_has_the_documents_its_models_declare(server: Server) -> None:
    """Before a run's first step its overview, heatmap, rank and failure documents leave keys
    out; what they carry is still what the models declare (and a short run's all of them)."""
    events = TableBuilder("event")
    events.add("time", [time.time()]).add("kind", ["job_start"]).add("step", [-1])
    events.add("message", [""]).add("attrs", [json.dumps({"config": {"lr": 1e-4}})])
    assert server.post(encode_batch({"event": events.build()}, {"run_id": "no-steps"})[1])[0] == 200
    assert server.post(step_batch("short", range(0, 3), 2)[1])[0] == 200
    for run in ("no-steps", "short"):
        overview = OverviewOut.model_validate(server.get(f"/v1/runs/{run}/overview"))
        assert (overview.window is None) == (run == "no-steps")
        heatmap = HeatmapOut.model_validate(server.get(f"/v1/runs/{run}/heatmap?slowest=2"))
        assert (heatmap.rows is None) == (run == "no-steps")
        RankDetailOut.model_validate(server.get(f"/v1/runs/{run}/ranks/0/detail"))
        FailurePageOut.model_validate(server.get(f"/v1/runs/{run}/failure"))
    OnCallOut.model_validate(server.get("/v1/portal/oncall"))
    PortalCapacityOut.model_validate(server.get("/v1/portal/capacity"))
    PortalRunsOut.model_validate(server.get("/v1/portal/runs?sort=goodput"))
