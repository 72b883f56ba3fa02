"""The analysis cursor is versioned (issue 34): an older state is read into the current shape in
one place, so a running analysis resumes where it was; a newer server's state is refused by
name and left as it was stored, never reset."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from bench._detect_harness import Bench
from fleetlens.config import AnalyzerConfig
from fleetlens.services.analyzer import analyze_once
from fleetlens.services.cursor import VERSION, CursorVersionError, migrate
from fleetlens.store.models import AnalysisCursor
from fleetlens.store.scoped import scoped

pytestmark = pytest.mark.unit

# The shape a server before cursor versions stored: no version, blocks and the committed
# straggler state went with ``done``.
V1 = {
    "jobs": {
        "run-a0": {
            "done": 199,
            "cusum": {"world": 4},
            "t": [1.0, 2.0],
            "steps": [0, 199],
            "tail": [199, 3, 2],  # before version 3: passes over an unchanged tail
        },
        "run-a1": {"done": 19},
    },
    "bl_compute": {"n": 3},
}


def test_a_version_1_cursor_is_read_into_the_current_shape() -> None:
    stored = copy.deepcopy(V1)
    state = migrate(stored)
    assert stored == V1  # the stored state is not touched
    assert state["version"] == VERSION == 3
    a0, a1 = state["jobs"]["run-a0"], state["jobs"]["run-a1"]
    assert (a0["blocked"], a0["sealed"]) == (199, 199)  # analysed through 199: not again
    assert a1["blocked"] == 19 and "sealed" not in a1  # its straggler scan never ran
    assert "tail" not in a0  # the loop comes back on arrival, not for counted passes
    assert state["coll"] == {} and state["bl_compute"] == {"n": 3}
    assert migrate(state) == state  # the current shape goes through unchanged


@pytest.mark.parametrize("version", [4, 99, "2"])
def test_a_cursor_this_server_cannot_read_is_refused_by_name(version: object) -> None:
    with pytest.raises(CursorVersionError, match=f"version {version!r}.*up to {VERSION}"):
        migrate({"version": version, "jobs": {}})


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    b = Bench(tmp_path)
    try:
        yield b
    finally:
        b.close()


def _state(bench: Bench, tenant: str, run_id: str) -> dict[str, Any]:
    """The cursor's state as stored."""
    with bench.meta.session() as s:
        q = scoped(select(AnalysisCursor), tenant).where(AnalysisCursor.run_id == run_id)
        cursor = s.scalars(q).one()
        return dict(cursor.state)


def test_an_old_cursor_resumes_and_a_newer_ones_run_waits(
    bench: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    truth, rows = bench.run("straggler_persistent")
    run_id = truth.run_id
    tenant = "straggler_persistent"
    found = {(r["kind"], r["diagnosis"]) for r in rows}
    assert ("straggler", "straggler.persistent") in found
    state = _state(bench, tenant, run_id)
    # The same state as an older server stored it: the next pass resumes, and finds the same.
    v1 = copy.deepcopy(state)
    del v1["version"]
    for js in v1["jobs"].values():
        del js["blocked"]
    bench.store.save_cursor(tenant, run_id, -1.0, v1, 0)  # an older server's: no count
    analyze_once(bench.tel, bench.store, time.time(), AnalyzerConfig(max_steps=100))
    # (Its late scalars are looked at again: the old cursor had no count of arrivals.)
    resumed = _state(bench, tenant, run_id)["jobs"]
    assert {j: {k: v for k, v in js.items() if k != "sc"} for j, js in resumed.items()} == {
        j: {k: v for k, v in js.items() if k != "sc"} for j, js in state["jobs"].items()
    }
    # A newer server's state (here its attempts under another key): not read as an empty
    # cursor and analysed again from the first step over it, but left as stored, and said.
    newer = {"version": VERSION + 1, "attempts": state["jobs"]}
    bench.store.save_cursor(tenant, run_id, -1.0, newer, 0)
    with caplog.at_level(logging.WARNING, logger="fleetlens.analyzer"):
        for _ in range(2):
            analyze_once(bench.tel, bench.store, time.time(), AnalyzerConfig(max_steps=100))
    assert _state(bench, tenant, run_id) == newer
    assert f"run {run_id} not analysed: the analysis cursor is version 4" in caplog.text
