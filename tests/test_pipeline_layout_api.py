"""The parallel layout and the stage imbalance where a user reads them (issue 33): the run's
layout in GET /v1/runs/{id} and the run page's document, a rank's place in it in the rank
page's, and the imbalance among the run page's findings with its cost. The detection itself is
tested in test_pipeline_stages.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench._delivery import from_matrix
from fleetlens.analysis.layout import layout_of
from fleetlens.sim.emit import encode
from fleetlens.testing import InProcessServer, wait_passes, wait_until

from .test_pipeline_stages import STEPS, _job

pytestmark = pytest.mark.api


def test_the_layout_and_the_imbalance_reach_the_api_and_the_run_page_document(
    tmp_path: Path,
) -> None:
    """What a user reads: the run's layout (GET /v1/runs/{id} and the run page's document), a
    rank's place in it (the rank page's document), and the imbalance among the findings with
    its share of the goodput breakdown's straggler line."""
    config = {"pipeline_model_parallel_size": 4}
    lay = layout_of(config, 8)
    assert lay is not None
    x = _job(8, lay.stages(8), [1.0, 1.0, 1.0, 1.6], {}, seed=4)
    rec = from_matrix("pp4-api", np.arange(STEPS), x, 1.7e9, config)
    fast = {"FLEETLENS_ANALYSIS_INTERVAL_S": "0.2"}  # passes five times a second
    with InProcessServer(str(tmp_path / "data"), env=fast) as srv:
        for ctx, tables in [*rec.first, *rec.other]:
            assert srv.post(encode(ctx, tables))[0] == 200
        for ctx, cols in rec.steps:
            assert srv.post(encode(ctx, {"step": (len(cols["step"]), cols)}))[0] == 200

        def imbalance() -> list[dict[str, Any]]:
            found = srv.get("/v1/runs/pp4-api/diagnosis")["findings"]
            return [f for f in found if f["diagnosis"] == "stage_imbalance"]

        wait_until(imbalance, timeout=60)  # the steps reach the loop with the registry's flush
        wait_passes(srv, 3)  # and later passes change nothing below
        run = srv.get("/v1/runs/pp4-api")
        assert run["layout"] == {"tp": 1, "pp": 4, "dp": 2, "cp": 1, "ep": 1, "vpp": 1,
                                 "world": 8, "order": ["pp", "dp", "cp", "tp"],
                                 "source": "config"}  # fmt: skip
        doc = srv.get("/v1/runs/pp4-api/overview")
        assert doc["layout"] == run["layout"]
        (imb,) = [f for f in doc["findings"] if f["diagnosis"] == "stage_imbalance"]
        assert imb["owner"] == "training_config" and imb["cost"]["totalSeconds"] > 0
        assert not [f for f in doc["findings"] if f["kind"] == "straggler"]
        rank = srv.get("/v1/runs/pp4-api/ranks/7/detail")
        assert rank["coords"] == {"pp": 3, "dp": 1, "cp": 0, "tp": 0}
        # the what-if: the heavy stage at the other stages' time saves 0.6 of every 1.6 s step
        w = srv.get("/v1/runs/pp4-api/whatif/stragglers")
        assert w["layout"]["pp"] == 4 and w["steps"] == STEPS
        (f,) = w["findings"]
        assert f["diagnosis"] == "stage_imbalance" and f["share"] == pytest.approx(0.375, abs=0.03)
        assert w["byType"]["stages"] == pytest.approx(f["savedSeconds"], rel=0.05)
        assert w["slowdown"] >= f["speedup"]
        assert (
            srv.request("GET", "/v1/runs/pp4-api/whatif/stragglers?fromStep=9&toStep=3")[0] == 400
        )
        # a run with no step yet: nothing to replay, said as such (not an error the page logs)
        bare = from_matrix("pp4-bare", np.arange(1), x[:1], 1.7e9, config)
        for ctx, tables in bare.first:
            assert srv.post(encode(ctx, tables))[0] == 200
        empty = srv.get("/v1/runs/pp4-bare/whatif/stragglers")
        assert empty["steps"] == 0 and empty["findings"] == [] and empty["slowdown"] == 0
