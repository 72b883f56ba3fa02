"""A hung run's pages render. A hang finding's evidence holds the ranks the others wait for (a
list); the portal's number formatter took it for a number ("Could not load: v.toFixed is not a
function", the run page retried forever and the failure page stayed on "Loading...")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fleetlens.sim.library import run_scenario
from fleetlens.testing import Server, wait_until

from .test_portal import _open

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    """The ``hang`` scenario played into a server, analysed until its hang is found."""
    srv = Server(
        str(tmp_path_factory.mktemp("hang") / "data"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "0.5"}
    ).start()
    try:
        run_id = run_scenario("hang", server=srv.url, speed=0).truth.run_id

        def hang_found() -> bool:
            found = srv.get(f"/v1/runs/{run_id}/diagnosis")["findings"]
            return any(f["kind"] == "hang" for f in found)

        wait_until(hang_found, timeout=90, what="the hang's finding")
        yield srv, run_id
    finally:
        srv.stop()


def _hang_evidence(srv: Server, run_id: str) -> list[Any]:
    found = srv.get(f"/v1/runs/{run_id}/diagnosis")["findings"]
    return [e.get("value") for f in found if f["kind"] == "hang" for e in f["evidence"]]


def test_a_hung_runs_page_renders_its_hang(hung: tuple[Server, str], browser: Any) -> None:
    srv, run_id = hung
    assert any(isinstance(v, list) for v in _hang_evidence(srv, run_id)), "no list to format"
    page, errors = _open(browser, f"{srv.url}/runs/{run_id}", None)
    assert errors == [], errors
    assert "Job hung" in page.inner_text("#findings")
    assert page.locator("#findings [data-code=hang]").count()


def test_a_hung_runs_failure_page_renders(hung: tuple[Server, str], browser: Any) -> None:
    srv, run_id = hung
    page, errors = _open(browser, f"{srv.url}/runs/{run_id}/failure", None)
    assert errors == [], errors
    assert "Loading" not in page.inner_text("main")


def test_pages_carry_security_headers_and_run_under_their_policy(hung: tuple[Server, str]) -> None:
    """No sniffing on any answer; a page cannot be framed and runs only the server's scripts
    (the run page above loaded under that policy with no console error)."""
    import urllib.request

    srv, run_id = hung
    with urllib.request.urlopen(f"{srv.url}/runs/{run_id}") as r:
        page = r.headers  # case-insensitive
    assert page["X-Content-Type-Options"] == "nosniff"
    assert page["X-Frame-Options"] == "DENY"
    csp = page["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self' 'sha256-" in csp, csp
    scripts = csp.split("script-src")[1].split(";")[0]
    assert "unsafe-eval" not in csp and "'unsafe-inline'" not in scripts, csp
    with urllib.request.urlopen(f"{srv.url}/v1/runs") as r:
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers.get("Content-Security-Policy") is None  # JSON: nothing to run
