"""The web portal in a real browser: headless Chromium (the system's) driven by Playwright.

A simulated run (the ``demo`` scenario: a persistent straggler on rank 37, a thermal event, a
fatal Xid 79 and a restart, a data stall) is played into a real server; each page must render
with its data and no console error, the heatmap must outline the straggler's row and the failure
page must name the injected cause. Two remediation actions are recorded for the run in the
server's metadata database, as the controller records them (one that took the straggler's node
out and resumed, one draining); the run page must show their phases and the on-call page the one
under way, and approving from a page must go through the API with the page's token. On a server
that requires tokens, a user signs in on the page itself (a refused token, a viewer's, an ingest
token's 403, signing out), and an on-call token of a third tenant reads every tenant's faulty
nodes, actions and alerts on the On-call page and none of their runs' contents.
``FLEETLENS_SCREENSHOTS=DIR`` saves a screenshot per page.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from fleetlens.alerts.store import AlertView, queue_order
from fleetlens.remediation.models import Remediation
from fleetlens.services.portal import Executions, run_summary, step_buckets
from fleetlens.services.runs_types import SummaryWindow
from fleetlens.sim.library import load_scenario, run_scenario
from fleetlens.store.access import AccessStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.testing import Server, step_batch
from fleetlens.wire import TableBuilder, encode_batch

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# `fleetlens serve`, with the portal's routers added when app.py does not include them yet.
LAUNCH = """
import sys, uvicorn
from fleetlens.server import create_app
from fleetlens.config import ServerConfig
cfg = ServerConfig.resolve({"data_dir": sys.argv[1], "port": int(sys.argv[2]), "host": "127.0.0.1"})
app = create_app(cfg)
if not any(getattr(r, "path", "") == "/oncall" for r in app.routes):
    from fleetlens.api.portal import router as portal_router
    from fleetlens.ui.pages import router as pages_router
    app.include_router(portal_router)
    app.include_router(pages_router)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


class PortalServer(Server):
    def start(self, timeout: float = 60.0) -> Server:
        import urllib.error
        import urllib.request

        self.log_path = os.path.join(self.data_dir, f"server-{self.port}.log")
        os.makedirs(self.data_dir, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", LAUNCH, self.data_dir, str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1):
                    return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        raise RuntimeError(f"server did not come up in {timeout}s:\n{self.log()}")


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM) or shutil.which("chromium") is None,
        reason="needs Debian's chromium (apt-get install chromium)",
    ),
]
playwright = pytest.importorskip("playwright.sync_api")

RUN = "demo-run"


def _metadata(srv: Server) -> MetadataStore:
    return MetadataStore(f"sqlite:///{os.path.join(srv.data_dir, 'metadata.db')}")


def _record(srv: Server, node: str, state: str, **fields: Any) -> int:
    """Write a remediation action into the running server's metadata database; its id."""
    now = time.time()
    row: dict[str, Any] = {
        "tenant": "default",
        "run_id": RUN,
        "job_id": "",
        "node": node,
        "ranks": [],
        "reason": "straggler",
        "summary": f"{node} is slow",
        "finding_key": f"test:{node}:{now}",
        "mode": "approve",
        "state": state,
        "decided_at": now,
        "updated_at": now,
        "approved_by": "",
        "world_before": 256,
        "world_after": 0,
        "stop_step": -1,
        "resume_step": -1,
        "checkpoint": {},
        "phases": {"detection": [now - 30.0, now]},
        "acks": [],
        "actuators": [],
        "cost": {},
        "error": "",
    }
    row.update(fields)
    meta = _metadata(srv)
    try:
        with meta._session() as s:
            r = Remediation(**row)
            s.add(r)
            s.flush()
            return int(r.id)
    finally:
        meta.close()


def _record_demo_actions(srv: Server) -> None:
    """The straggler's node (rank 37 on node-0004) taken out 10 minutes ago and resumed at 248
    ranks; the thermal node draining now, its ranks not yet at a step boundary."""
    t = time.time() - 600.0
    spans = [
        ("approval", 4.0),
        ("wait", 0.7),
        ("checkpoint", 0.02),
        ("verify", 0.03),
        ("remove", 0.15),
        ("rendezvous", 8.1),
        ("reload", 0.2),
        ("warmup", 0.1),
    ]
    phases: dict[str, list[float | None]] = {"detection": [t - 120.0, t]}
    at = t
    for name, seconds in spans:
        phases[name] = [at, at + seconds]
        at += seconds
    _record(
        srv,
        "node-0004",
        "resumed",
        job_id="demo-run-a1",
        ranks=list(range(32, 40)),
        summary="rank 37 on node-0004 computes 30% slower than the median for 400 steps",
        decided_at=t,
        updated_at=at,
        approved_by="local",
        world_after=248,
        stop_step=1510,
        resume_step=1510,
        checkpoint={
            "path": "/ckpt/demo-run/step-1510.pt",
            "sha256": "0" * 64,
            "verifiedBy": "rank 0 (read-back checksum)",
        },
        phases=phases,
        acks=[{"event": "resumed", "jobId": "demo-run-a2", "time": at, "step": 1510}],
    )
    now = time.time()
    _record(
        srv,
        "node-0011",
        "draining",
        job_id="demo-run-a2",
        reason="thermal",
        summary="node-0011 GPU 3 throttles its clock at 91 °C",
        mode="automatic",
        decided_at=now - 42.0,
        updated_at=now - 42.0,
        phases={"detection": [now - 100.0, now - 42.0], "wait": [now - 42.0, None]},
    )


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server with the demo scenario played into it and analysed, and two remediation
    actions recorded for the run (read-only for tests)."""
    srv = PortalServer(
        str(tmp_path_factory.mktemp("portal") / "data"),
        env={"FLEETLENS_ANALYSIS_INTERVAL_S": "0.5"},
    ).start()
    try:
        run_scenario(load_scenario("demo"), server=srv.url, speed=0)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                found = {f["diagnosis"] for f in srv.get(f"/v1/runs/{RUN}/diagnosis")["findings"]}
                found |= {a["alertname"] for a in srv.get("/v1/alerts?state=firing")["alerts"]}
            except OSError:
                found = set()
            # the findings, and the alert the same pass raises after them
            if {"straggler.persistent", "fatal_xid", "FatalHardwareFault"} <= found:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the analysis found only {found}:\n{srv.log()}")
        _record_demo_actions(srv)
        yield srv
    finally:
        srv.stop()


def _open(
    browser: Any, url: str, name: str | None, token: str | None = None, confirm: bool = True
) -> tuple[Any, list[str]]:
    """Load a page, wait for its data, and return it with every console error and failed load
    (``token``: the page's sessionStorage token, as a user signs in; ``confirm``: how the user
    answers a confirmation dialog, whose messages go to ``page.dialogs``)."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.dialogs = []

    def answer(d: Any) -> None:
        page.dialogs.append(d.message)
        d.accept() if confirm else d.dismiss()

    page.on("dialog", answer)
    if token:
        page.add_init_script(f"sessionStorage.setItem('fleetlens.token', {json.dumps(token)})")
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    # A fetch cancelled by a navigation (a reload while the page refreshes) is not a failure.
    page.on(
        "requestfailed",
        lambda r: errors.append(f"failed {r.url}") if r.failure != "net::ERR_ABORTED" else None,
    )
    page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.goto(url)
    page.wait_for_selector("body[data-loaded]", timeout=30_000)
    assert page.get_attribute("body", "data-loaded") == "true", page.inner_text("#status")
    shots = os.environ.get("FLEETLENS_SCREENSHOTS")
    if shots and name:
        os.makedirs(shots, exist_ok=True)
        page.screenshot(path=os.path.join(shots, f"{name}.png"), full_page=True)
    return page, errors


def test_run_page_shows_goodput_charts_and_the_stragglers_heatmap_row(
    played: Server, browser: Any
) -> None:
    page, errors = _open(browser, f"{played.url}/runs/{RUN}", "run")
    assert errors == []
    assert page.get_attribute("body", "data-painted") == "true"
    now = page.inner_text("#now")
    assert "Goodput (job)" in now and "Tokens consumed" in now
    mfu = played.get(f"/v1/runs/{RUN}")["mfu"]
    if mfu["value"] is not None:
        assert f"{100 * mfu['value']:.1f}%" in now, now
    else:
        assert f"unknown: {mfu['missing']}" in now, now
    assert "productive" in page.inner_text("#breakdown")
    assert "Runtime" in page.inner_text("#factors")
    for chart in ("step", "goodput", "loss", "lr", "grad_norm", "tps"):  # uPlot's canvases
        assert page.get_attribute(f"#chart-{chart}", "aria-label"), chart
        assert page.locator(f"#chart-{chart} canvas").count() >= 1, chart
    strip = page.locator("#chart-timeline svg")
    assert strip.get_attribute("aria-label") and strip.locator("rect").count() > 0
    # The heatmap outlines the row holding rank 37 and names it.
    hot = page.locator("#heat-hot")
    assert int(hot.get_attribute("data-rank-from") or -1) <= 37
    assert int(hot.get_attribute("data-rank-to") or -1) >= 37
    assert hot.get_attribute("data-rank") == "37"
    assert "rank 37" in (page.get_attribute("#heatmap", "aria-label") or "")
    first = page.locator("#ranks tbody tr").first
    assert first.locator("th").inner_text() == "37"
    assert "node-0004" in first.inner_text()
    thermal = page.locator("#ranks tbody tr", has_text="node-0011").inner_text()
    assert "throttle" in thermal  # the thermal rank's hardware evidence
    findings = page.inner_text("#findings")
    assert "Slow rank (every step)" in findings and "infrastructure" in findings
    assert page.locator("#findings [title='straggler.persistent']").count()
    timeline = page.inner_text("#timeline")
    assert "checkpoint_end" in timeline and "restart" in timeline.lower()
    assert "FatalHardwareFault" in timeline
    # In the order things happened: the restart (which resumes at an earlier step) after the
    # fault that caused it.
    kinds = page.locator("#timeline tbody tr td:nth-child(3)").all_inner_texts()
    fault = next(i for i, k in enumerate(kinds) if k in ("hardware_fault", "failure"))
    restart = next(i for i, k in enumerate(kinds) if k == "restart")
    assert fault < restart, kinds
    assert page.locator("th[scope=col]").count() > 10


def test_failure_page_names_the_injected_cause(played: Server, browser: Any) -> None:
    page, errors = _open(browser, f"{played.url}/runs/{RUN}/failure", "failure")
    assert errors == []
    what = page.inner_text("#f-what")
    assert "Xid 79" in what or "xid" in what.lower()
    assert "node-0018" in what
    # Implicated: the failing rank, and only ranks measurably slower than their peers.
    doc = played.get(f"/v1/runs/{RUN}/failure")
    failed = doc["failure"]["rank"]
    assert doc["infrastructure"][0]["rank"] == failed
    others = doc["infrastructure"][1:]
    assert all(r["computeSlowdown"] >= 1.05 for r in others), others
    assert page.inner_text("#cause-diagnosis") == "GPU failure (fatal Xid)"
    assert page.get_attribute("#cause-diagnosis [data-code]", "title") == "fatal_xid"
    assert "loss" in page.inner_text("#f-training")
    assert "node-0018" in page.inner_text("#f-infra")
    assert page.inner_text("#f-rec").strip()
    assert page.locator("#f-related tbody tr").count() > 0


def _live_run_on(srv: Server, run_id: str, node: str) -> None:
    """A run still sending steps, placed on ``node``."""
    _, body = step_batch(run_id, range(0, 20), 2)
    assert srv.post(body)[0] == 200
    place = TableBuilder("placement")
    place.add("time", [time.time()] * 2).add("rank", [0, 1]).add("local_rank", [0, 1])
    place.add("world_size", [2, 2]).add("node_id", [node, node]).add("gpu", [0, 1])
    _, body = encode_batch({"placement": place.build()}, {"run_id": run_id, "job_id": "j1"})
    assert srv.post(body)[0] == 200


def test_oncall_page_lists_jobs_faulty_nodes_and_alerts(played: Server, browser: Any) -> None:
    """Live jobs only (the demo run has finished); the node whose fatal Xid fired its alert,
    with the live job placed on it; each alert with its age, runbook, run and failure page, and
    acknowledged from the page."""
    _live_run_on(played, "live-run", "node-0018")
    page, errors = _open(browser, f"{played.url}/oncall", "oncall")
    assert errors == []
    jobs = page.inner_text("#jobs")
    assert "live-run" in jobs and RUN not in jobs
    assert "%" in page.locator("#jobs tbody tr").first.inner_text()
    node = page.locator("#nodes tbody tr", has_text="node-0018")
    assert node.get_by_role("link", name="live-run").get_attribute("href") == "/runs/live-run"
    assert "node-0018" in page.inner_text("#drains")
    row = page.locator("#alerts tbody tr", has_text="FatalHardwareFault").first
    assert row.locator("th a").get_attribute("href") == "/runbooks#FatalHardwareFault"
    assert row.get_by_role("link", name="failure page").get_attribute("href") == (
        f"/runs/{RUN}/failure"
    )
    cells = [c.strip() for c in row.locator("th, td").all_inner_texts()]
    value, unit = cells[4].split()  # its age
    assert unit in ("s", "min", "h") and float(value) > 0
    (alert,) = [
        a for a in played.get("/v1/alerts?state=firing")["alerts"]
        if a["alertname"] == "FatalHardwareFault" and a["runId"] == RUN
    ]  # fmt: skip
    assert alert["annotations"]["runbook_url"] == "/runbooks#FatalHardwareFault"
    row.get_by_role("button", name=f"Acknowledge alert FatalHardwareFault #{alert['id']}").click()
    playwright.expect(row.locator("td").nth(4)).to_contain_text("local, ")
    assert played.get(f"/v1/alerts/{alert['id']}")["ackedBy"] == "local"
    assert page.locator("#incidents tbody tr th").count() >= 1
    assert errors == []
    # The runbook the alert links to says what to do, with the policy in force.
    page.goto(f"{played.url}/runbooks#FatalHardwareFault")
    page.wait_for_selector("body[data-loaded=true]")
    section = page.locator("section", has=page.locator("#rb-FatalHardwareFault")).inner_text()
    assert "page to infra_oncall" in section and "fatal_xid" in section and "Cordon" in section
    assert errors == []


def test_oncall_alerts_are_a_queue_pages_first_then_unhandled_then_oldest(
    played: Server, browser: Any
) -> None:
    """They were listed as the store last touched them: a ticket could sit above a page, an
    acknowledged alert above one nobody had seen."""

    def alert(name: str, severity: str, starts: float, acked: bool = False) -> AlertView:
        return AlertView(1, "fp", name, severity, "researcher", "firing", "r", {}, {}, None,
                         None, starts, None, "ana" if acked else None, None, None, None, "t",
                         silenced_by=[])  # fmt: skip

    mixed = [
        alert("old-ticket", "ticket", 1.0),
        alert("new-page-acked", "page", 3.0, acked=True),
        alert("new-page", "page", 3.0),
        alert("old-page", "page", 2.0),
    ]
    assert [a.alertname for a in sorted(mixed, key=queue_order)] == [
        "old-page", "new-page", "new-page-acked", "old-ticket"
    ]  # fmt: skip

    def order(a: dict[str, Any]) -> tuple[int, bool, float]:  # queue_order, of the document
        rank = {"page": 2, "ticket": 1}.get(a["severity"], 0)
        return (-rank, bool(a["ackedBy"]) or bool(a["silencedBy"]), float(a["startsAt"]))

    # The on-call document and page list them in that order.
    alerts = played.get("/v1/portal/oncall")["alerts"]
    assert alerts and [order(a) for a in alerts] == sorted(map(order, alerts))
    page, errors = _open(browser, f"{played.url}/oncall", None)
    shown = [t.split("\n")[0].strip() for t in page.locator("#alerts tbody th").all_inner_texts()]
    assert shown == [a["alertname"] for a in alerts][: len(shown)], shown
    assert errors == []


def test_silencing_an_alert_from_the_oncall_page(played: Server, browser: Any) -> None:
    # The page refreshes every second here: a silence being written is not redrawn away.
    page, errors = _open(browser, f"{played.url}/oncall?refresh=1", None)
    row = page.locator("#alerts tbody tr", has_text="FatalHardwareFault").first
    (alert,) = [
        a for a in played.get("/v1/alerts?state=firing")["alerts"]
        if a["alertname"] == "FatalHardwareFault" and a["runId"] == RUN
    ]  # fmt: skip
    # Escape and Cancel close the form and send nothing (it had neither).
    opener = row.get_by_role("button", name=f"Silence alert FatalHardwareFault #{alert['id']}")
    opener.click()
    row.get_by_label("because").press("Escape")
    playwright.expect(row.locator("form.silence-form")).to_be_hidden()
    playwright.expect(opener).to_be_visible()
    opener.click()
    row.get_by_role("button", name="Cancel").click()
    playwright.expect(row.locator("form.silence-form")).to_be_hidden()
    assert played.get("/v1/silences")["silences"] == []
    opener.click()
    row.get_by_label("for").select_option("14400")
    row.get_by_role("button", name="Silence", exact=True).click()  # no reason yet: refused
    playwright.expect(row.get_by_role("alert").filter(has_text="Say why")).to_have_count(1)
    row.get_by_label("because").fill("GPU swap")
    page.wait_for_timeout(2500)  # two refreshes' time: the form, its choice and text remain
    assert row.get_by_label("because").input_value() == "GPU swap"
    assert row.get_by_label("for").input_value() == "14400"
    row.get_by_label("because").fill("GPU swap scheduled")
    row.get_by_role("button", name="Silence", exact=True).click()
    playwright.expect(row).to_contain_text("silenced (#")
    (sil,) = played.get("/v1/silences")["silences"]
    assert sil["matchers"] == {"alertname": "FatalHardwareFault", "run_id": RUN}
    assert sil["endsAt"] - sil["startsAt"] == pytest.approx(14400, abs=1)
    assert played.get(f"/v1/alerts/{alert['id']}")["state"] == "firing"  # still firing
    listed = page.locator("#silences tbody tr", has_text=f"#{sil['id']}")
    assert "GPU swap scheduled" in listed.inner_text() and "in force" in listed.inner_text()
    assert "UTC UTC" not in listed.inner_text()
    listed.get_by_role("button", name=f"Expire silence #{sil['id']}").click()
    playwright.expect(page.locator("#silences tbody tr", has_text=f"#{sil['id']}")).to_contain_text(
        "ended"
    )
    assert played.get("/v1/silences")["silences"][0]["endsAt"] <= time.time()
    assert errors == []


def test_run_page_shows_remediation_actions_and_their_phase_timings(
    played: Server, browser: Any
) -> None:
    before = _thermal_action_state(played)  # the controller may move it on while the page loads
    page, errors = _open(browser, f"{played.url}/runs/{RUN}", None)
    assert errors == []
    assert page.get_by_role("heading", name="Remediation").count() == 1
    resumed = page.locator("#remediations tbody tr", has_text="node-0004")
    assert resumed.count() == 1
    cells = [c.strip() for c in resumed.locator("th, td").all_inner_texts()]
    assert cells[1:4] == ["node-0004", "straggler", "resumed"]
    assert cells[5:10] == [
        "256 → 248",
        "1510 → 1510",
        "0",
        "13.3 s",  # approval 4 s + the pause's 9.3 s, from the decision to the first step
        "rank 0 (read-back checksum)",
    ]
    aid = cells[0].lstrip("#")
    phases = page.locator(f"#phases-{aid}")
    caption = phases.locator("caption").inner_text()
    assert "recovery 13.3 s (training paused 9.30 s): approval 4.00 s, wait 0.70 s" in caption
    assert "rendezvous 8.10 s" in caption
    assert "checkpoint 0.020 s" in caption and "wait 0.70 s" in caption
    rows = {
        r.locator("th").inner_text(): r.locator("td").first.inner_text()
        for r in phases.locator("tbody tr").all()
    }
    assert list(rows) == [
        "detection",
        "approval",
        "wait",
        "checkpoint",
        "verify",
        "remove",
        "rendezvous",
        "reload",
        "warmup",
    ]
    assert rows["rendezvous"] == "8.10 s" and rows["checkpoint"] == "0.020 s"
    # One bar per phase of the pause, as wide as its share: rendezvous is 8.1 of 9.3 s.
    bar = phases.locator("tbody tr", has_text="rendezvous").locator(".bar")
    assert bar.get_attribute("style") == "width: 87.1%;"
    assert phases.locator(".bar").count() == 7
    draining = page.locator("#remediations tbody tr", has_text="node-0011")
    state = draining.locator(".state").inner_text()
    assert state in (before, _thermal_action_state(played))
    assert "under way" in draining.inner_text()
    assert draining.get_attribute("class") == "pending"
    assert f"node-0011 {state}" in page.inner_text("#now")


def _thermal_action_state(srv: Server) -> str:
    """The thermal node's action, recorded draining: the server's controller moves it on to
    removing once it sees the attempt ended (the played run is over: its ranks are gone, so
    there is no drain checkpoint to wait for), and then to restarting, as fast as a loaded
    machine runs it. Each is under way; the pages show the state the API has."""
    (act,) = [a for a in srv.get("/v1/remediations")["remediations"] if a["node"] == "node-0011"]
    assert act["state"] in ("draining", "removing", "restarting"), act
    return str(act["state"])


def test_oncall_page_lists_the_drain_under_way(played: Server, browser: Any) -> None:
    before = _thermal_action_state(played)  # the controller may move it on while the page loads
    page, errors = _open(browser, f"{played.url}/oncall", None)
    assert errors == []
    row = page.locator("#actions tbody tr", has_text="node-0011")
    cells = [c.strip() for c in row.locator("th, td").all_inner_texts()]
    assert cells[:2] == ["node-0011", RUN] and cells[4] == "thermal", cells
    assert row.locator(".state").inner_text() in (before, _thermal_action_state(played)), cells
    value, unit = cells[3].split()  # its age, since the decision 42 s before the fixture ended
    assert unit in ("s", "min") and 40 <= float(value) * (60 if unit == "min" else 1) < 3600
    assert row.get_by_role("link", name=RUN).get_attribute("href") == f"/runs/{RUN}#remediation"
    # An action that resumed is no longer in progress; the drain events are still listed.
    assert "node-0004" not in page.inner_text("#actions")
    assert "node-0018" in page.inner_text("#drains")


def test_approving_from_the_page_goes_through_the_api_with_its_token(
    played: Server, browser: Any
) -> None:
    # The demo run has finished: its pending action offers no Approve (approving it once drained
    # a node out of a finished run and rewrote its wall clock and goodput), and the API says so.
    ended = _record(played, "node-0096", "awaiting_approval")
    page, errors = _open(browser, f"{played.url}/runs/{RUN}", None)
    row = page.locator("#remediations tbody tr", has_text="node-0096")
    assert "the run has ended (finished)" in row.inner_text()
    assert row.get_by_role("button").count() == 0 and errors == []
    status, refused = played.request("POST", f"/v1/remediations/{ended}/approve")
    assert status == 409 and "has ended (FINISHED)" in refused["error"], refused
    assert played.request("POST", f"/v1/remediations/{ended}/reject")[0] == 200

    live = "approve-run"  # a run still sending steps: its actions are approved from the page
    _live_run_on(played, live, "node-0097")
    url = f"{played.url}/runs/{live}"
    meta = _metadata(played)
    try:
        viewer, _ = AccessStore(meta).create_token("default", "viewer", name="portal test")
    finally:
        meta.close()
    pending = _record(played, "node-0099", "awaiting_approval", run_id=live)
    button = f"Approve action #{pending}: take node-0099 out of run {live}"

    # A viewer's page shows the pending action and, on approving, the API's 403.
    page, errors = _open(browser, url, None, token=viewer)
    row = page.locator("#remediations tbody tr", has_text="node-0099")
    assert "awaiting approval" in row.inner_text()
    assert row.get_attribute("class") == "pending"
    stale, stale_errors = _open(browser, url, None)  # an admin's, opened before anyone acts
    page.get_by_role("button", name=button).click()
    playwright.expect(row.get_by_role("alert")).to_contain_text("HTTP 403")
    assert errors and all("403" in e for e in errors), errors
    assert played.get(f"/v1/remediations/{pending}")["state"] == "awaiting_approval"

    # Someone approves it meanwhile: the stale page's button answers 409 and stays disabled.
    status, _ = played.request("POST", f"/v1/remediations/{pending}/approve")
    assert status == 200
    stale.get_by_role("button", name=button).click()
    alert = stale.locator("#remediations tbody tr", has_text="node-0099").get_by_role("alert")
    playwright.expect(alert).to_contain_text("HTTP 409")
    assert "only a pending one can be approved" in alert.inner_text()
    assert stale.get_by_role("button", name=button).is_disabled()
    assert stale_errors and all("409" in e for e in stale_errors), stale_errors

    # Approved from the page: the row shows what the controller did (no job polls its control
    # channel, so the node is drained and the job left alone).
    pending = _record(played, "node-0098", "awaiting_approval", run_id=live)
    page, errors = _open(browser, url, None)
    # Dismissing the confirmation leaves it pending: nothing is sent.
    unsure, unsure_errors = _open(browser, url, None, confirm=False)
    unsure.get_by_role(
        "button", name=f"Approve action #{pending}: take node-0098 out of run {live}"
    ).click()
    assert unsure.dialogs == [
        f"Take node-0098 out of run {live}? The job stops at its next step boundary, "
        "checkpoints and goes on without the node."
    ]
    assert played.get(f"/v1/remediations/{pending}")["state"] == "awaiting_approval"
    assert unsure_errors == []
    page.get_by_role(
        "button", name=f"Approve action #{pending}: take node-0098 out of run {live}"
    ).click()
    row = page.locator("#remediations tbody tr", has_text="node-0098")
    playwright.expect(row.locator(".state")).to_have_text("drained")
    assert "not polling its control channel" in row.inner_text()
    assert errors == []
    assert played.get(f"/v1/remediations/{pending}")["state"] == "drained"


def test_capacity_page_shows_waterfall_losses_and_cost(played: Server, browser: Any) -> None:
    page, errors = _open(browser, f"{played.url}/capacity", "capacity")
    assert errors == []
    assert "$" in page.inner_text("#cap-now")
    wf = page.inner_text("#waterfall")
    for step in ("in service", "scheduling loss", "runtime loss", "program loss", "useful"):
        assert step in wf
    assert "straggler" in page.inner_text("#loss-cause")
    assert "finding: GPU failure (fatal Xid)" in page.inner_text("#failures")
    assert page.locator("#failures [data-code=fatal_xid]").count()
    assert page.locator("#chart-waterfall svg rect").count() >= 5


def test_runs_list_links_to_the_run_and_a_hidden_run_is_404(played: Server, browser: Any) -> None:
    page, errors = _open(browser, f"{played.url}/", "runs")
    assert errors == []
    page.get_by_role("link", name=RUN).first.focus()
    page.keyboard.press("Enter")
    page.wait_for_selector("body[data-loaded=true]")
    assert page.url.endswith(f"/runs/{RUN}")
    status, _ = played.request("GET", "/runs/no-such-run")
    assert status == 404
    status, _ = played.request("GET", "/v1/runs/no-such-run/overview")
    assert status == 404
    spec = played.get("/openapi.json")["paths"]
    assert "/oncall" not in spec and "/runs/{run_id}" not in spec
    assert "/v1/runs/{run_id}/overview" in spec


def test_heatmap_endpoint_downsamples_to_the_cells_asked(played: Server) -> None:
    h = played.get(f"/v1/runs/{RUN}/heatmap?fromStep=300&toStep=1799&ranks=16&steps=50")
    assert h["rows"] == 16 and h["columns"] == 50 and h["ranksPerRow"] == 16
    assert len(h["cells"]) == 16 and all(len(r) == 50 for r in h["cells"])
    assert h["hot"]["row"] == 37 // 16 and h["hot"]["rank"] == 37
    status, _ = played.request("GET", f"/v1/runs/{RUN}/heatmap?fromStep=9&toStep=1")
    assert status == 400


def test_heatmap_document_lists_the_slowest_ranks_of_its_window(played: Server) -> None:
    h = played.get(f"/v1/runs/{RUN}/heatmap?slowest=3")
    assert [r["rank"] for r in h["slowestRanks"]][:1] == [37]
    assert len(h["slowestRanks"]) == 3
    assert "slowestRanks" not in played.get(f"/v1/runs/{RUN}/heatmap")


def _fetch(srv: Server, path: str, headers: dict[str, str]) -> tuple[bytes, Any]:
    import urllib.request

    req = urllib.request.Request(srv.url + path, headers=headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read(), r.headers


def test_overview_is_gzipped_for_a_browser_and_times_its_parts(played: Server) -> None:
    path = f"/v1/runs/{RUN}/overview"
    body, headers = _fetch(played, path, {"Accept-Encoding": "gzip, deflate, br"})
    assert headers["Content-Encoding"] == "gzip"
    doc = json.loads(gzip.decompress(body))
    plain, plain_headers = _fetch(played, path, {})
    assert plain_headers.get("Content-Encoding") is None
    assert len(body) < len(plain) / 3
    assert json.loads(plain).keys() == doc.keys()
    parts = dict(p.strip().split(";dur=") for p in headers["Server-Timing"].split(","))
    assert {"steps", "scalars", "goodput", "timeline", "remediation", "encode"} <= parts.keys()
    # The heatmap is below the fold: it is the page's second document, not part of the first.
    assert "heatmap" not in doc and "slowestRanks" not in doc


def test_overview_figures_equal_the_run_and_goodput_endpoints(played: Server) -> None:
    """The overview derives the summary and goodput from one read of the rollup; they must be
    what the API's own endpoints answer (the demo run restarts and replays steps)."""
    doc = played.get(f"/v1/runs/{RUN}/overview")
    run = played.get(f"/v1/runs/{RUN}")
    s = doc["summary"]
    for key in ("steps", "step", "tokensProcessed", "worldSize", "window"):
        assert s[key] == run[key], key
    assert s["metrics"] == pytest.approx(run["metrics"], rel=1e-9)
    assert doc["mfu"] == run["mfu"]  # the same MFU, or the same reason there is none
    goodput = played.get(f"/v1/runs/{RUN}/goodput")
    got_f, want_f = doc["goodput"]["factors"], goodput["factors"]
    assert got_f.pop("lossShares") == pytest.approx(want_f.pop("lossShares"), rel=1e-9)
    assert got_f == pytest.approx(want_f, rel=1e-9)
    got, want = doc["goodput"]["breakdown"], goodput["breakdown"]
    seconds = {line["category"]: line["seconds"] for line in got["lines"]}
    assert seconds == pytest.approx(
        {line["category"]: line["seconds"] for line in want["lines"]}, rel=1e-9, abs=1e-9
    )
    assert got["attempts"] == want["attempts"] >= 2
    assert got["reworkedExecutions"] == want["reworkedExecutions"] > 0
    # The step series covers every step once (a replayed step counts at its latest attempt).
    assert sum(b["steps"] for b in doc["stepSeries"]) == run["steps"]
    assert sum(b["tokens"] for b in doc["stepSeries"]) == run["tokensProcessed"]
    assert set(doc["scalars"]) >= {"loss", "lr", "grad_norm"}


def _executions(rows: list[tuple[int, str, float, float, float]]) -> Executions:
    """(step, job, start, duration, slowest compute) rows; 8 ranks, 100 tokens per step."""
    step, job, start, dur, cmax = (np.array(c) for c in zip(*rows, strict=True))
    n = len(step)
    return Executions(
        step=step.astype(np.int64),
        job_id=job.astype(object),
        start=start.astype(np.float64),
        end=(start + dur).astype(np.float64),
        max_duration=dur.astype(np.float64),
        mean_duration=dur * 0.5,
        max_compute=cmax.astype(np.float64),
        mean_compute=cmax * 0.5,
        ranks=np.full(n, 8, np.int64),
        tokens=np.full(n, 100, np.int64),
        data_wait=np.zeros(n),
    )


def test_step_buckets_and_summary_count_a_replayed_step_at_its_latest_attempt() -> None:
    # Job a ran steps 0-3, job b replayed 2-3 (slower) and ran 4-5; rows arrive unordered.
    ex = _executions(
        [
            (2, "b", 110.0, 3.0, 2.0),
            (0, "a", 100.0, 1.0, 0.5),
            (1, "a", 101.0, 2.0, 1.0),
            (2, "a", 103.0, 1.0, 0.5),
            (3, "a", 104.0, 1.0, 0.5),
            (3, "b", 113.0, 5.0, 4.0),
            (4, "b", 118.0, 1.0, 0.5),
            (5, "b", 119.0, 2.0, 1.0),
        ]
    )
    per_step = ex.latest()
    assert per_step.step.tolist() == [0, 1, 2, 3, 4, 5]
    assert per_step.job_id.tolist() == ["a", "a", "b", "b", "b", "b"]
    buckets = step_buckets(per_step, 0, 5, 2)  # two buckets of three steps
    assert [b.step for b in buckets] == [0, 3]
    assert [b.steps for b in buckets] == [3, 3]
    assert [(b.min, b.p50, b.max) for b in buckets] == [(1.0, 2.0, 3.0), (1.0, 2.0, 5.0)]
    assert [b.compute_max for b in buckets] == [1.1667, 1.8333]
    assert [b.t for b in buckets] == [100.0, 113.0]
    assert [b.tokens for b in buckets] == [300, 300]
    assert buckets[0].tokens_per_second == round(300 / 6.0, 1)
    summary = run_summary(per_step, {"loss": 2.5}, window=4)
    assert summary.steps == 6 and summary.step == 5
    assert summary.tokens_processed == 600 and summary.world_size == 8
    assert summary.window == SummaryWindow(from_step=2, to_step=5, steps=4)
    assert summary.scalars == {"loss": 2.5}
    assert summary.step_time_ms == 2500.0  # median of 3, 5, 1, 2
    assert summary.mean_rank_step_time_ms == 1250.0
    assert summary.tokens_per_second == pytest.approx(400 / 11.0)
    assert step_buckets(per_step, 10, 20, 5) == []
    assert run_summary(ex.take(np.zeros(0, np.intp)), {}).step is None


# --------------------------------------------------------------------------- signing in

SIGNED_RUN = "signin-run"


def _cli_token(data: str, role: str) -> str:
    """A token made as an operator makes one, before the server starts."""
    out = subprocess.run(
        [
            *(sys.executable, "-m", "fleetlens", "tokens", "create", "--data", data),
            *("--tenant", "acme", "--role", role, "--name", f"portal {role}"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    """A server with ``--auth required``, tenant acme's tokens by role, and a run of acme's
    sent with its ingest token."""
    data = str(tmp_path_factory.mktemp("secured") / "data")
    os.makedirs(data)  # `tokens create` does not make the directory
    tokens = {role: _cli_token(data, role) for role in ("admin", "viewer", "ingest")}
    srv = Server(data, extra_args=("--auth", "required")).start()
    try:
        assert (
            srv.post(step_batch(SIGNED_RUN, range(0, 20), 4)[1], token=tokens["ingest"])[0] == 200
        )
        deadline = time.monotonic() + 30
        while SIGNED_RUN not in str(srv.get("/v1/runs", token=tokens["admin"])):
            assert time.monotonic() < deadline, srv.log()
            time.sleep(0.2)
        yield srv, tokens
    finally:
        srv.stop()


def test_shells_and_static_files_load_without_a_token_but_no_data_does(
    secured: tuple[Server, dict[str, str]],
) -> None:
    srv, tokens = secured
    for path in ("/", f"/runs/{SIGNED_RUN}", f"/runs/{SIGNED_RUN}/failure", "/oncall", "/capacity"):
        status, page = srv.request("GET", path)
        assert status == 200, (path, page)
        assert 'data-auth="required"' in page and 'id="signin"' in page
    for name in ("app.js", "charts.js", "plots.js", "run.js", "style.css"):
        assert srv.request("GET", f"/ui/static/{name}")[0] == 200, name
    for name in ("uPlot.iife.min.js", "uPlot.min.css"):
        assert srv.request("GET", f"/ui/static/vendor/uplot/{name}")[0] == 200, name
    assert srv.request("GET", "/v1/runs")[0] == 401
    assert srv.request("GET", f"/v1/runs/{SIGNED_RUN}/overview")[0] == 401
    # With a token, a page is checked as the API is: a run the caller may not see is a 404.
    assert srv.request("GET", "/runs/no-such-run", token=tokens["viewer"])[0] == 404
    assert srv.request("GET", f"/runs/{SIGNED_RUN}", token=tokens["viewer"])[0] == 200
    assert srv.request("GET", "/", token=tokens["ingest"])[0] == 403


def test_signing_in_on_a_server_that_requires_tokens(
    secured: tuple[Server, dict[str, str]], browser: Any
) -> None:
    srv, tokens = secured
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    console: list[str] = []
    responses: list[str] = []
    urls: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console.append(str(e)))
    page.on("requestfailed", lambda r: console.append(f"failed {r.url}"))
    page.on(
        "response", lambda r: responses.append(f"{r.status} {r.url}") if r.status >= 400 else None
    )
    page.on("request", lambda r: urls.append(r.url))
    form = page.get_by_role("region", name="Sign in")
    field = page.get_by_label("API token")
    alert = form.get_by_role("alert")

    # No token: the form, focused, and no request for data.
    page.goto(f"{srv.url}/")
    page.wait_for_selector("body[data-loaded=signin]")
    playwright.expect(field).to_be_visible()
    playwright.expect(field).to_be_focused()
    assert field.get_attribute("type") == "password"
    assert "fleetlens tokens create" in form.inner_text()
    assert page.locator("#content").is_hidden()
    assert page.get_by_role("button", name="Sign out").is_hidden()
    assert not [u for u in urls if "/v1/" in u]

    # A wrong token, typed and sent with Enter: refused, forgotten, the form stays.
    page.keyboard.type("fl_" + "x" * 43)
    page.keyboard.press("Enter")
    playwright.expect(alert).to_contain_text("this token was refused")
    playwright.expect(field).to_be_focused()
    shots = os.environ.get("FLEETLENS_SCREENSHOTS")
    if shots:
        os.makedirs(shots, exist_ok=True)
        page.screenshot(path=os.path.join(shots, "signin.png"))
    assert page.get_attribute("body", "data-loaded") == "signin"
    assert page.evaluate("sessionStorage.getItem('fleetlens.token')") is None

    # A viewer's token: the runs list with the run ingested with the ingest token.
    field.fill(tokens["viewer"])
    form.get_by_role("button", name="Sign in").click()
    page.wait_for_selector("body[data-loaded=true]")
    assert form.is_hidden()
    assert page.get_by_role("link", name=SIGNED_RUN).count() == 1
    assert page.evaluate("sessionStorage.getItem('fleetlens.token')") == tokens["viewer"]
    assert page.evaluate("localStorage.length") == 0
    # The token goes along to the next page of the same tab.
    page.get_by_role("link", name=SIGNED_RUN).click()
    page.wait_for_selector("body[data-loaded=true]")
    assert page.url == f"{srv.url}/runs/{SIGNED_RUN}"
    assert "RUNNING" in page.inner_text("#now") or "Status" in page.inner_text("#now")

    # Signing out forgets the token: the form again.
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_selector("body[data-loaded=signin]")
    playwright.expect(field).to_be_focused()
    assert page.evaluate("sessionStorage.getItem('fleetlens.token')") is None
    assert page.get_by_role("button", name="Sign out").is_hidden()

    # An ingest-only token: not the sign-in loop but what is wrong with its role.
    field.fill(tokens["ingest"])
    page.keyboard.press("Enter")
    page.wait_for_selector("body[data-loaded=forbidden]")
    denied = page.get_by_role("region", name="This token may not read this page")
    playwright.expect(denied.get_by_role("alert")).to_contain_text("role 'ingest' may not read")
    assert "viewer, editor or admin" in denied.inner_text()
    assert form.is_hidden()
    page.get_by_role("button", name="Use another token").click()
    playwright.expect(field).to_be_focused()

    # The errors are the two answers the server was meant to give, and nothing else.
    overview = f"403 {srv.url}/v1/runs/{SIGNED_RUN}/overview?points="  # signed out on the run page
    assert len(responses) == 2 and responses[1].startswith(overview), responses
    assert responses[0].startswith(f"401 {srv.url}/v1/portal/runs?"), responses
    expected = re.compile(r"Failed to load resource: the server responded with a status of 40[13] ")
    assert len(console) == 2 and all(expected.match(e) for e in console), console
    # The token is in no URL and no log line.
    secrets = (tokens["viewer"], tokens["ingest"], "x" * 43)
    assert not [u for u in urls if any(t in u for t in secrets)]
    assert not [t for t in secrets if t in srv.log()]


# --------------------------------------------------------------------------- on-call role

# Each tenant's run: its config and its scalars are the run's contents, which an on-call token
# must not get; the node is where the fatal Xid happens (bolt's only).
TENANT_RUNS = {
    "acme": ("acme-run", "acme-node-3", {"dataset": "acme-private-corpus", "total_steps": 987654},
             ("acme_secret_metric", 6.02214076)),
    "bolt": ("bolt-run", "bolt-node-7", {"dataset": "bolt-private-dataset", "lr": 0.000271828},
             ("loss", 2.71828183)),
}  # fmt: skip
RUN_CONTENTS = ("acme-private-corpus", "987654", "acme_secret_metric", "6.02214", "acme-proj",
                "bolt-private-dataset", "0.000271828", "2.71828", "bolt-proj")  # fmt: skip


def _tenant_run(srv: Server, token: str, tenant: str) -> None:
    run, node, config, (metric, value) = TENANT_RUNS[tenant]
    ctx = {"run_id": run, "job_id": f"{run}-a1", "project": f"{tenant}-proj"}
    ev = TableBuilder("event")
    ev.add("time", [time.time() - 120]).add("kind", ["job_start"])
    ev.add("attrs", [json.dumps({"config": config})])
    pl = TableBuilder("placement")
    pl.add("time", [time.time() - 120]).add("rank", [0]).add("node_id", [node])
    sc = TableBuilder("scalar")
    sc.add("step", [0, 4]).add("time", [time.time() - 60] * 2).add("name", [metric] * 2)
    sc.add("value", [value, value])
    tables = {"event": ev.build(), "placement": pl.build(), "scalar": sc.build()}
    assert srv.post(encode_batch(tables, ctx)[1], token=token)[0] == 200
    assert srv.post(step_batch(run, range(0, 5), 2, ctx=ctx)[1], token=token)[0] == 200


def _fatal_xid(srv: Server, token: str, tenant: str) -> None:
    """A fatal Xid 79 on the tenant's node, as its node agent reports it."""
    run, node, _, _ = TENANT_RUNS[tenant]
    ev = TableBuilder("event")
    ev.add("time", [time.time()]).add("kind", ["hardware_fault"]).add("step", [4])
    ev.add("node_id", [node]).add("gpu", [0]).add("attrs", ['{"xid": 79}'])
    ctx = {"run_id": run, "job_id": f"{run}-a1", "project": f"{tenant}-proj"}
    assert srv.post(encode_batch({"event": ev.build()}, ctx)[1], token=token)[0] == 200


@pytest.fixture
def fleet(tmp_path: Any) -> Iterator[tuple[Server, dict[str, str]]]:
    """A server with ``--auth required`` and two tenants with a run each; a fatal Xid on bolt's
    node has fired its alert and the controller has recommended taking the node out (the
    default mode). Tokens: acme's viewer, bolt's admin, and the on-call engineer's (tenant ops)."""
    data = str(tmp_path / "data")
    os.makedirs(data)
    meta = MetadataStore(f"sqlite:///{data}/metadata.db")
    specs = {
        "acme-ingest": ("acme", "ingest"),
        "acme-viewer": ("acme", "viewer"),
        "bolt-ingest": ("bolt", "ingest"),
        "bolt-admin": ("bolt", "admin"),
        "oncall": ("ops", "oncall"),
    }
    try:
        access = AccessStore(meta)
        tokens = {n: access.create_token(t, r, name=f"portal {n}")[0]
                  for n, (t, r) in specs.items()}  # fmt: skip
    finally:
        meta.close()
    srv = Server(
        data, extra_args=("--auth", "required"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "0.5"}
    ).start()
    try:
        _tenant_run(srv, tokens["acme-ingest"], "acme")
        _tenant_run(srv, tokens["bolt-ingest"], "bolt")
        _fatal_xid(srv, tokens["bolt-ingest"], "bolt")
        deadline = time.monotonic() + 60
        while not srv.get("/v1/remediations", token=tokens["bolt-admin"])["remediations"]:
            assert time.monotonic() < deadline, f"no action recommended:\n{srv.log()}"
            time.sleep(0.25)
        yield srv, tokens
    finally:
        srv.stop()


def test_oncall_document_has_every_tenants_nodes_and_actions_but_no_run_contents(
    fleet: tuple[Server, dict[str, str]],
) -> None:
    srv, tokens = fleet
    doc = srv.get("/v1/portal/oncall", token=tokens["oncall"])
    assert doc["view"] == "infra"
    assert [(n["node"], n["fatal"], n["recoverable"], n["runs"]) for n in doc["nodes"]] == [
        ("bolt-node-7", 1, 0, [{"tenant": "bolt", "runId": "bolt-run"}])
    ]
    assert [(a["tenant"], a["node"], a["runId"], a["state"]) for a in doc["remediations"]] == [
        ("bolt", "bolt-node-7", "bolt-run", "recommended")
    ]
    fatal = [a for a in doc["alerts"] if a["alertname"] == "FatalHardwareFault"]
    assert [(a["tenant"], a["node"], a["gpu"], a["runId"]) for a in fatal] == [
        ("bolt", "bolt-node-7", "0", "bolt-run")
    ]
    assert [(i["tenant"], i["runId"]) for i in doc["incidents"]] == [("bolt", "bolt-run")]
    # None of either tenant's runs' contents: no jobs, goodput or spread, no config, no scalar.
    assert "jobs" not in doc
    text = json.dumps(doc)
    for word in ("goodput", "spread", "config", "checkpoint", *RUN_CONTENTS):
        assert word not in text, word
    # Their runs' data stay closed to the role; only the on-call page and its document open.
    assert srv.request("GET", "/oncall", token=tokens["oncall"])[0] == 200
    for path in ("/", "/capacity", "/runs/bolt-run", "/v1/runs", "/v1/runs/bolt-run/overview"):
        status, answer = srv.request("GET", path, token=tokens["oncall"])
        assert status == 403, (path, answer)
    assert srv.request("GET", "/v1/portal/oncall", token=tokens["acme-ingest"])[0] == 403
    # A viewer's document is its tenant's, as before: its jobs with their goodput and spread.
    mine = srv.get("/v1/portal/oncall", token=tokens["acme-viewer"])
    assert mine["view"] == "tenant"
    assert [j["runId"] for j in mine["jobs"]] == ["acme-run"]
    assert "goodput" in mine["jobs"][0] and "spread" in mine["jobs"][0]
    assert "bolt" not in json.dumps(mine)


def test_oncall_page_for_the_oncall_role_and_a_viewer(
    fleet: tuple[Server, dict[str, str]], browser: Any
) -> None:
    srv, tokens = fleet
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("dialog", lambda d: d.accept())  # yes, take the node out
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    # A refresh's fetch cancelled by leaving the page is not a failure (as in ``_open``).
    page.on(
        "requestfailed",
        lambda r: errors.append(f"failed {r.url}") if r.failure != "net::ERR_ABORTED" else None,
    )
    page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)

    # The on-call engineer signs in on the On-call page with the role's own token.
    page.goto(f"{srv.url}/oncall")
    page.wait_for_selector("body[data-loaded=signin]")
    page.get_by_label("API token").fill(tokens["oncall"])
    page.keyboard.press("Enter")
    page.wait_for_selector("body[data-loaded=true]")
    shots = os.environ.get("FLEETLENS_SCREENSHOTS")
    if shots:
        os.makedirs(shots, exist_ok=True)
        page.screenshot(path=os.path.join(shots, "oncall-infra.png"), full_page=True)
    assert errors == []
    # No jobs by goodput, no per-rank spread: they are the runs' contents.
    assert page.locator("#jobs").is_hidden()
    playwright.expect(page.locator("#jobs-hidden")).to_contain_text("Not shown to the on-call role")
    content = page.inner_text("#content")
    for word in ("%", *RUN_CONTENTS):
        assert word not in content, word
    # Bolt's faulty node and the action recommended for it, with its tenant; no run is linked.
    heads = page.locator("#nodes thead th").all_inner_texts()
    assert heads == ["Node", "Fatal", "Recoverable", "Tenant: run", "Latest"]
    node = page.locator("#nodes tbody tr", has_text="bolt-node-7")
    cells = [c.strip() for c in node.locator("th, td").all_inner_texts()]
    assert cells[:4] == ["bolt-node-7", "1", "0", "bolt: bolt-run"]
    assert cells[4].startswith("FatalHardwareFault: ")
    row = page.locator("#actions tbody tr", has_text="bolt-node-7")
    cells = [c.strip() for c in row.locator("th, td").all_inner_texts()]
    assert cells[:3] == ["bolt-node-7", "bolt", "bolt-run"] and "recommended" in cells[3]
    alert = page.locator("#alerts tbody tr", has_text="FatalHardwareFault").inner_text()
    assert "bolt" in alert and "bolt-node-7 GPU 0" in alert and "bolt-run" in alert
    # no run is linked (its pages are closed to the role); the alerts link their runbooks
    assert page.locator("#content a[href^='/runs']").count() == 0
    assert page.get_attribute("#alerts tbody th a", "href") == "/runbooks#FatalHardwareFault"

    # On-call first acknowledges another tenant's infrastructure alert (a writer of that
    # tenant, or the on-call role, may).
    row = page.locator("#alerts tbody tr", has_text="FatalHardwareFault")
    ack = row.get_by_role("button", name=re.compile("Acknowledge alert FatalHardwareFault"))
    alert_id = (ack.get_attribute("aria-label") or "").rpartition("#")[2]
    ack.click()
    acked_row = page.locator("#alerts tbody tr", has_text="portal oncall, ")
    playwright.expect(acked_row).to_have_count(1, timeout=20_000)
    assert "FatalHardwareFault" in acked_row.inner_text()
    acked = srv.get(f"/v1/alerts/{alert_id}", token=tokens["bolt-admin"])
    assert acked["ackedBy"] == "portal oncall"
    # Then approves the drain: approving from the page carries it out with the on-call token
    # (audited as its name). Once the node is out its fault stops firing and leaves the list,
    # so the acknowledgement comes first, as an on-call engineer's does.
    rid = srv.get("/v1/remediations", token=tokens["bolt-admin"])["remediations"][0]["id"]
    page.get_by_role(
        "button", name=f"Approve action #{rid}: take bolt-node-7 out of run bolt-run of tenant bolt"
    ).click()
    playwright.expect(page.locator("#actions tbody tr", has_text="bolt-node-7")).to_have_count(
        0, timeout=20_000
    )
    done = srv.get(f"/v1/remediations/{rid}", token=tokens["bolt-admin"])
    assert done["state"] == "drained" and done["approvedBy"] == "portal oncall", done
    assert errors == []

    # The runs list is not the role's: the 403 points to the On-call page, which reloads.
    page.get_by_role("navigation", name="Portal").get_by_role("link", name="Runs").click()
    page.wait_for_selector("body[data-loaded=forbidden]")
    denied = page.get_by_role("region", name="This token may not read this page")
    playwright.expect(denied.get_by_role("alert")).to_contain_text("role 'oncall' may not read")
    denied.get_by_role("link", name="On-call page").click()
    page.wait_for_selector("body[data-loaded=true]")
    assert page.url == f"{srv.url}/oncall"
    # The one error is that 403 (the response, and the browser's console line for it).
    response, console = sorted(errors)
    assert response.startswith(f"403 {srv.url}/v1/portal/runs?"), errors
    assert console.startswith("Failed to load resource: the server responded with a status of 403")

    # A viewer's On-call page is as it was: its own tenant's jobs, linked, and nothing of bolt's.
    mine, mine_errors = _open(browser, f"{srv.url}/oncall", None, token=tokens["acme-viewer"])
    assert mine_errors == []
    assert mine.locator("#jobs").is_visible() and mine.locator("#jobs-hidden").is_hidden()
    assert mine.get_by_role("link", name="acme-run").get_attribute("href") == "/runs/acme-run"
    assert "Tenant: run" not in mine.locator("#nodes thead").inner_text()
    assert "bolt" not in mine.inner_text("#content")


def test_api_docs_render_offline_from_the_vendored_swagger_ui(played: Server, browser: Any) -> None:
    """`/docs` (which the demo prints) draws every route with no request leaving the host: the
    browser is cut off from everything but the server, as on an air-gapped cluster."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    outside: list[str] = []

    def only_the_server(route: Any) -> None:
        if route.request.url.startswith(played.url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_server)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(played.url + "/docs")
    page.wait_for_selector(".opblock", timeout=30_000)
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert "/v1/runs/{run_id}" in [p.replace("\u200b", "") for p in paths], paths[:10]
    assert len(paths) > 50 and outside == [] and errors == [], (outside, errors)
    # The bundle goes out compressed.
    body, headers = _fetch(played, "/ui/static/vendor/swagger-ui/swagger-ui-bundle.js",
                           {"Accept-Encoding": "gzip"})  # fmt: skip
    assert headers.get("Content-Encoding") == "gzip" and len(body) < 700_000
    page.close()


PHONE = {"width": 390, "height": 844}


def test_every_page_fits_a_phone_without_scrolling_sideways(played: Server, browser: Any) -> None:
    ctx = browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True)
    try:
        for path in ("/", f"/runs/{RUN}", f"/runs/{RUN}/failure", "/oncall", "/capacity",
                     "/compare", "/models", "/runbooks"):  # fmt: skip
            page = ctx.new_page()
            page.goto(played.url + path)
            page.wait_for_selector("body[data-loaded]", timeout=30_000)
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= PHONE["width"], (path, wide)
            # The tables one acts from are a card per row: no cell (Cost, Action, Acknowledge,
            # Silence) is scrolled out of sight to the right.
            hidden, cells = page.evaluate(
                """() => { const c = [...document.querySelectorAll(
                  'table.stack tbody td, table.stack tbody th')].filter((e) => e.offsetParent);
                return [c.filter((e) => e.getBoundingClientRect().right > innerWidth + 1)
                  .map((e) => e.dataset.label || e.textContent.slice(0, 30)), c.length]; }"""
            )
            assert hidden == [], (path, hidden)
            if path == f"/runs/{RUN}":
                assert page.locator("#wrong-table td[data-label=Action]").count() > 0
                assert cells > 0
            if path == f"/runs/{RUN}" and (shots := os.environ.get("FLEETLENS_SCREENSHOTS")):
                page.screenshot(path=os.path.join(shots, "run-phone.png"))
            page.close()
    finally:
        ctx.close()


def test_dark_mode_follows_the_system_setting(played: Server, browser: Any) -> None:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="dark")
    try:
        page = ctx.new_page()
        page.goto(f"{played.url}/runs/{RUN}")
        page.wait_for_selector("body[data-loaded=true]", timeout=30_000)
        style = "getComputedStyle(document.body)"
        bg, fg = page.evaluate(f"[{style}.backgroundColor, {style}.color]")

        def luminance(rgb: str) -> float:
            r, g, b = (int(v) for v in re.findall(r"\d+", rgb)[:3])
            return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255

        assert luminance(bg) < 0.15 and luminance(fg) > 0.8, (bg, fg)
        head = page.evaluate("getComputedStyle(document.querySelector('thead th')).backgroundColor")
        assert luminance(head) < 0.2, head
        # The heatmap's cells are dark too (they were a white block), the slow row still red.
        page.locator("#heatmap").scroll_into_view_if_needed()
        page.wait_for_selector("#heatmap[role=img]", timeout=30_000)
        cells = page.evaluate(
            """() => { const c = document.getElementById('heatmap'), k = window.devicePixelRatio;
            const w = c.width - (58 + 112) * k, h = Math.min(c.height - (8 + 38) * k, 200 * k);
            const d = c.getContext('2d').getImageData(58 * k, 8 * k, w, h).data;
            let sum = 0, red = 0;
            for (let i = 0; i < d.length; i += 4) {
              sum += (0.2126 * d[i] + 0.7152 * d[i + 1] + 0.0722 * d[i + 2]) / 255;
              if (d[i] > 150 && d[i + 1] < 90) red++;
            }
            return [sum / (d.length / 4), red]; }"""
        )
        assert cells[0] < 0.3 and cells[1] > 0, cells
        if shots := os.environ.get("FLEETLENS_SCREENSHOTS"):
            page.screenshot(path=os.path.join(shots, "run-dark.png"))
    finally:
        ctx.close()
