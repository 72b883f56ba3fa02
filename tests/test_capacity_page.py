"""The capacity page never shows the impossible: two runs holding more GPU-hours than the pool
had in service (as when two runs report the same GPUs, or the capacity records miss some) give
figures of at most 100%, a cost per useful GPU-hour of at least the price, the oversubscription
said as such, and a period and price that the URL keeps.

The pool is Slurm's `gpu` partition of tests/test_importers.py (four 8-GPU nodes, allocations
from 2024-05-01 00:00 to 11:00 UTC: 352 in-service GPU-hours); each run has 64 ranks stepping
for about 4.8 hours from 01:00 (~307 GPU-hours each).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fleetlens.api.portal_fleet_models import PortalCapacityOut
from fleetlens.testing import Server, step_batch

from .test_importers import SACCT
from .test_portal import _open, playwright, pytestmark  # noqa: F401 - e2e, Chromium or skip
from .test_scheduler_import import SINFO, T0

PRICE = 3.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(str(tmp_path_factory.mktemp("capacity") / "data")).start()
    try:
        for fmt, data, extra in (("sacct", SACCT, {}), ("sinfo", SINFO, {"time": T0})):
            st, out = srv.request("POST", "/v1/scheduler/import",
                                  {"format": fmt, "data": data, **extra})  # fmt: skip
            assert st == 200, out
        for run in ("twin-a", "twin-b"):
            _, body = step_batch(run, range(0, 240), 64, base=60.0, t0=T0 + 3600)
            assert srv.post(body)[0] == 200
        yield srv
    finally:
        srv.stop()


def test_oversubscription_is_said_and_no_figure_passes_100_percent(fleet: Server) -> None:
    d = fleet.get(f"/v1/portal/capacity?price={PRICE}")
    PortalCapacityOut.model_validate(d)  # what /openapi.json documents, no key more
    assert d["runs"] == 2 and d["inServiceGpuHours"] == pytest.approx(352.0, rel=0.01)
    held = d["heldGpuHours"]
    assert held > 600  # two runs of 64 GPUs for ~4.8 h each
    assert d["oversubscribedGpuHours"] == pytest.approx(held - d["inServiceGpuHours"])
    assert 0 < d["utilization"] <= 1 and 0 < d["goodput"] <= 1
    assert d["costPerUsefulGpuHour"] >= PRICE
    (warning,) = d["warnings"]
    assert "more than the pools had in service" in warning
    wf = {w["step"]: w["gpuHours"] for w in d["waterfall"]}
    assert wf["in service"] == pytest.approx(held)  # shares are of what was held
    lost = wf["scheduling loss"] + wf["runtime loss"] + wf["program loss"]
    assert wf["in service"] + lost == pytest.approx(wf["useful"], rel=1e-6)
    # A period that ends before the runs and the pool's records began has neither.
    empty = fleet.get("/v1/portal/capacity?periodHours=1")
    PortalCapacityOut.model_validate(empty)
    assert empty["runs"] == 0 and empty["pools"] == [] and empty["period"]["hours"] == 1.0


def test_the_page_keeps_period_and_price_in_the_url_and_warns(fleet: Server, browser: Any) -> None:
    page, errors = _open(browser, f"{fleet.url}/capacity?period=&price={PRICE}", "capacity-over")
    cards = page.inner_text("#cap-now")
    assert f"at ${PRICE:.2f}/GPU-h" in cards and "GPU-h held beyond capacity" in cards
    shares = [float(v.rstrip("%")) for v in cards.split() if v.endswith("%")]
    assert len(shares) == 2 and max(shares) <= 100  # utilization and goodput
    assert "more than the pools had in service" in page.inner_text("#cap-warnings")
    assert "everything on record" in page.inner_text("#cap-period-text")
    # the last 24 hours, at another price: into the URL, and kept by a reload
    page.select_option("#cap-period", "24")
    page.fill("#cap-price", "5")
    page.click("#cap-form button")
    playwright.expect(page.locator("#cap-period-text")).to_contain_text(", 0 runs")
    assert page.url.endswith("?period=24&price=5")
    page.reload()
    page.wait_for_selector("body[data-loaded=true]")
    assert page.input_value("#cap-period") == "24" and page.input_value("#cap-price") == "5.00"
    assert "0 runs" in page.inner_text("#cap-period-text")
    assert errors == []
