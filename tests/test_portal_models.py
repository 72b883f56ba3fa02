"""The portal's comparison, model and evaluation pages in a real browser (Debian's Chromium).

One server: three simulated runs (a baseline, the same with a doubled learning rate, and one
with a persistent straggler), and a model whose version 1 (a safe model) is in production and
whose version 2 (harmful on every safety prompt) was evaluated by a real worker and judged by a
gate that failed it. The compare page must say what the API's comparison says, with the goodput
of each run's page; the model page its versions, aliases, promotion history and the gate's
paired statistics; the evaluation page its regression and each example's score.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

from fleetlens.api.portal_fleet_models import PortalRunsOut
from fleetlens.sim.library import load_scenario, run_scenario
from fleetlens.testing import Server

from .test_eval_loop import _adapter, _run_with_checkpoints, _stop, _suite
from .test_eval_support import start_worker, wait_for
from .test_portal import _open, playwright, pytestmark  # noqa: F401 - e2e, Chromium or skip

CONFIG = {"model": "8b", "optim": {"lr": 3e-4}, "global_batch_size": 512, "seq_length": 8192}
GATES = [
    {"metric": "safety/unsafe_rate", "direction": "lower", "max": 0.02, "kind": "safety"},
    {"metric": "qa/exact_match", "test": "mcnemar", "maxRegression": 0.05},
]


@dataclasses.dataclass
class Played:
    srv: Server
    base_eval: str
    cand_eval: str
    decision: dict[str, Any]


def _sim(srv: Server, scenario: str, run_id: str, config: dict[str, Any]) -> None:
    scn = load_scenario(scenario)
    job = dataclasses.replace(scn.job, run_id=run_id, steps=300, checkpoint_every=100)
    run_scenario(scn, server=srv.url, speed=0, job=job)
    st, _ = srv.request("POST", f"/v1/runs/{run_id}/describe", {"config": config})
    assert st == 200


def _evaluate(srv: Server, model: str, version: str) -> dict[str, Any]:
    st, ev = srv.request(
        "POST", "/v1/evaluations",
        {"benchmarkSuite": "rel", "adapter": _adapter(model), "modelId": "llm",
         "modelVersion": version},
    )  # fmt: skip
    assert st == 202, ev
    return wait_for(srv, ev["evaluationId"], 120)


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Played]:
    data = tmp_path_factory.mktemp("portal-models") / "data"
    srv = Server(str(data), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "3600"}).start()
    worker = None
    try:
        _sim(srv, "_small", "cmp-base", CONFIG)
        _sim(srv, "_small", "cmp-lr", {**CONFIG, "optim": {"lr": 6e-4}})
        assert srv.request("POST", "/v1/evaluation-suites", _suite("rel", gates=GATES))[0] == 201
        for version in ("1", "2"):
            _run_with_checkpoints(srv, f"v{version}-run", (4,))
            st, _ = srv.request(
                "POST", "/v1/models",
                {"modelId": "llm", "version": version, "runId": f"v{version}-run", "step": 4},
            )  # fmt: skip
            assert st == 201
        worker = start_worker(srv, "--idle-exit", "600")
        base = _evaluate(srv, "safe_model", "1")
        for alias in ("canary", "production"):
            st, out = srv.request(
                "POST", f"/v1/models/llm/aliases/{alias}",
                {"version": "1", "overrideReason": "first model"},
            )  # fmt: skip
            assert st == 200, out
        cand = _evaluate(srv, "unsafe_model", "2")
        st, decision = srv.request(
            "POST", "/v1/gates", {"modelId": "llm", "version": "2", "policies": GATES}
        )
        assert st == 201 and not decision["passed"], decision
        yield Played(srv, base["evaluationId"], cand["evaluationId"], decision)
    finally:
        if worker is not None:
            _stop(worker)
        srv.stop()


def test_gate_decisions_are_listed_per_model(played: Played) -> None:
    srv = played.srv
    got = srv.get("/v1/models/llm/gates")["decisions"]
    assert [d["decisionId"] for d in got] == [played.decision["decisionId"]]
    assert got[0]["checks"] == played.decision["checks"]
    st, err = srv.request("GET", "/v1/models/nope/gates")
    assert st == 404 and "nope" in err["detail"]


def test_compare_page_shows_the_conclusion_and_the_run_pages_goodput(
    played: Played, browser: Any
) -> None:
    srv = played.srv
    api = srv.get("/v1/runs/compare?runs=cmp-base,cmp-lr")
    page, errors = _open(browser, f"{srv.url}/compare?runs=cmp-base,cmp-lr", "compare")
    concl = page.inner_text("#cmp-conclusion")
    (c,) = api["conclusions"]
    cause = "no regression" if c["cause"] == "none" else f"likely {c['cause']}"
    assert f"cmp-lr against cmp-base: {cause}" in concl
    assert all(line in concl for line in c["lines"])
    side = page.inner_text("#cmp-side")
    for run in ("cmp-base", "cmp-lr"):
        overview = srv.get(f"/v1/runs/{run}/overview")["goodput"]["factors"]
        assert f"{100 * overview['jobProduct']:.1f}%" in side
    assert page.get_attribute("#cmp-side thead th:nth-child(2) a", "href") == "/runs/cmp-base"
    cfg = page.inner_text("#cmp-config")
    assert "optim.lr" in cfg and "0.0003" in cfg and "0.0006" in cfg
    # both runs' loss, overlaid in one chart
    assert page.get_attribute("#cmp-chart-loss", "data-series") == "2"
    legend = page.inner_text("#cmp-chart-loss .u-legend")
    assert "cmp-base (baseline)" in legend and "cmp-lr" in legend
    assert page.locator("#cmp-chart-loss canvas").count() == 1
    # a new comparison from the form goes into the URL
    page.fill("#cmp-runs", "cmp-lr, cmp-base")
    page.click("#cmp-form button")
    page.wait_for_url(re.compile(r"runs=cmp-lr,cmp-base"))
    page.wait_for_selector("#cmp-conclusion article")
    assert "cmp-base against cmp-lr" in page.inner_text("#cmp-conclusion")
    assert errors == []


def test_model_page_shows_versions_aliases_history_and_the_gate(
    played: Played, browser: Any
) -> None:
    srv = played.srv
    page, errors = _open(browser, f"{srv.url}/models", "models")
    row = page.inner_text("#models tbody tr")
    assert "llm" in row and "canary → 1" in row and "production → 1" in row
    page.click("#models a:text('llm')")
    page.wait_for_url(f"{srv.url}/models/llm")
    page.wait_for_selector("body[data-loaded='true']")
    if shots := os.environ.get("FLEETLENS_SCREENSHOTS"):
        page.screenshot(path=os.path.join(shots, "model.png"), full_page=True)
    assert "production" in page.inner_text("#model-now") and "v1" in page.inner_text("#model-now")
    versions = page.inner_text("#versions")
    assert "v1-run" in versions and "v2-run" in versions
    history = page.inner_text("#history")
    assert history.count("first model") == 2 and "– → v1" in history
    decisions = page.inner_text("#decisions")
    d = played.decision
    assert d["decisionId"] in decisions and "failed: safety/unsafe_rate" in decisions
    check = next(c for c in d["checks"] if c["metric"] == "qa/exact_match")
    assert "mcnemar, p = " in decisions and f"{check['paired']} pairs" in decisions
    evals = page.inner_text("#model-evals")
    assert played.base_eval in evals and played.cand_eval in evals and "safety" in evals
    assert errors == []


def test_evaluation_page_shows_the_regression_and_each_example(
    played: Played, browser: Any
) -> None:
    srv = played.srv
    url = f"{srv.url}/evaluations/{played.cand_eval}"
    page, errors = _open(browser, url, "evaluation")
    reg = page.inner_text("#regressions")
    assert "safety" in reg and "safety/unsafe_rate" in reg and played.base_eval in reg
    assert "unsafe_rate" in page.inner_text("#metrics")
    rows = srv.get(f"/v1/evaluations/{played.cand_eval}/examples")["examples"]
    examples = {(r["benchmark"], r["exampleId"]) for r in rows}
    assert f"{len(examples)} of {len(examples)} examples" in page.inner_text("#examples caption")
    page.select_option("#ex-bench", "safety")
    safety = {r["exampleId"]: r["value"] for r in rows if r["metric"] == "unsafe_rate"}
    assert f"{len(safety)} of {len(examples)} examples" in page.inner_text("#examples caption")
    assert page.locator("#examples tbody tr").count() == len(safety)
    # Each example with what the model was asked, answered and expected (the worker's texts),
    # in the benchmark's natural order of ids (2 before 10), the whole text on hover.
    texts = {r["exampleId"]: r for r in rows if r["benchmark"] == "safety" and "prompt" in r}
    assert set(texts) == set(safety) and all("output" in r for r in texts.values())
    ids = page.locator("#examples tbody tr td:nth-child(2)").all_inner_texts()
    assert ids == sorted(safety, key=lambda i: [int(p) if p.isdigit() else p
                                                for p in re.split(r"(\d+)", i)])  # fmt: skip
    prompt = page.locator("#examples tbody tr:first-child td[data-label=Prompt] span")
    assert prompt.get_attribute("title") == texts[ids[0]]["prompt"]
    assert page.get_attribute(
        "#examples tbody tr:first-child td[data-label=Output] span", "title"
    ) in (texts[ids[0]]["output"], None)
    # sorted by a metric's header: the harmful answers (unsafe_rate 1) first when descending
    page.click("#examples thead button:text('unsafe_rate')")
    page.click("#examples thead button:text('unsafe_rate')")
    assert page.get_attribute("#examples thead th[aria-sort]", "aria-sort") == "descending"
    first = page.inner_text("#examples tbody tr:first-child td:nth-child(2)")
    assert safety[first] == max(safety.values()) == 1.0
    assert errors == []


def test_unknown_model_says_so(played: Played, browser: Any) -> None:
    page = browser.new_page()
    page.goto(f"{played.srv.url}/models/nope")
    page.wait_for_selector("body[data-loaded]")
    assert page.get_attribute("body", "data-loaded") == "notfound"
    content = page.inner_text("#content")
    assert "Not found" in content and "model 'nope' does not exist" in content
    assert page.get_attribute("#content a[href='/models']", "href") == "/models"


def test_compare_without_runs_asks_for_them(played: Played, browser: Any) -> None:
    page, errors = _open(browser, f"{played.srv.url}/compare", None)
    assert "Name two or more runs" in page.inner_text("#cmp-conclusion")
    assert errors == []


def test_runs_list_for_triage_searches_filters_and_sorts_with_the_state_in_the_url(
    played: Played, browser: Any
) -> None:
    srv = played.srv
    api = srv.get("/v1/portal/runs?q=cmp&sort=goodput&order=asc")
    PortalRunsOut.model_validate(api)  # what /openapi.json documents, no key more
    assert sorted(r["runId"] for r in api["runs"]) == ["cmp-base", "cmp-lr"]
    goodputs = [r["goodput"] for r in api["runs"]]
    assert goodputs == sorted(goodputs)
    for r in api["runs"]:  # the run page's goodput, and the run's step time
        overview = srv.get(f"/v1/runs/{r['runId']}/overview")
        assert r["goodput"] == pytest.approx(overview["goodput"]["factors"]["jobProduct"])
        assert r["stepTimeMs"] > 0 and r["durationSeconds"] > 0
    assert api["total"] == 2 and api["sortedWithin"] == 2
    assert srv.get("/v1/portal/runs?status=FAILED")["runs"] == []
    st, _ = srv.request("GET", "/v1/portal/runs?sort=nonsense")
    assert st == 422

    page, errors = _open(browser, f"{srv.url}/", "runs-triage")
    page.fill("#runs-q", "cmp")
    page.click("#runs-filter button[type=submit]")
    page.wait_for_url(re.compile(r"\?q=cmp$"))
    playwright.expect(page.locator("#runs tbody tr")).to_have_count(2)
    page.click("#runs thead button:text('Goodput')")
    page.wait_for_url(re.compile(r"sort=goodput&order=desc"))
    playwright.expect(page.locator("#runs thead th[aria-sort=descending]")).to_have_count(1)
    page.reload()
    page.wait_for_selector("body[data-loaded=true]")
    assert page.input_value("#runs-q") == "cmp"
    assert page.get_attribute("#runs thead th[aria-sort]", "aria-sort") == "descending"
    desc = srv.get("/v1/portal/runs?q=cmp&sort=goodput&order=desc")["runs"]
    assert page.inner_text("#runs tbody tr:first-child th") == desc[0]["runId"]
    cells = page.locator("#runs tbody tr:first-child td").all_inner_texts()
    assert cells[2].endswith("%") and cells[3].endswith(" ms")
    assert errors == []


def test_runs_ticked_on_the_list_open_the_compare_page(played: Played, browser: Any) -> None:
    """Two runs picked by their checkboxes (the first ticked is the baseline), kept through a
    search of the list, open the compare page with both."""
    page, errors = _open(browser, f"{played.srv.url}/", None)
    assert page.locator("#runs-compare").is_disabled()
    page.check("#runs input.pick[value=cmp-lr]")
    assert page.locator("#runs-compare").is_disabled()  # one run is not a comparison
    page.fill("#runs-q", "cmp-base")
    page.click("#runs-filter button[type=submit]")
    playwright.expect(page.locator("#runs tbody tr")).to_have_count(1)
    page.check("#runs input.pick[value=cmp-base]")
    assert "cmp-lr, cmp-base" in page.inner_text("#runs-picked")
    page.click("#runs-compare")
    page.wait_for_url(re.compile(r"/compare\?runs=cmp-lr,cmp-base$"))
    page.wait_for_selector("body[data-loaded=true]")
    assert "cmp-base against cmp-lr" in page.inner_text("#cmp-conclusion")
    assert errors == []
