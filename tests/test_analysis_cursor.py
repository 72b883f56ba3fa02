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
from fleetlens.analysis.ranks import RankStateDoc
from fleetlens.config import AnalyzerConfig
from fleetlens.services.analyzer import LoopCounts, analyze_once
from fleetlens.services.cursor import (
    VERSION,
    CursorCorruptError,
    CursorState,
    CursorVersionError,
    SlowCollectives,
    migrate,
    stored,
)
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
    stored_v1 = copy.deepcopy(V1)
    state = migrate(stored_v1)
    assert stored_v1 == V1  # the stored state is not touched
    assert isinstance(state, CursorState) and state.version == VERSION == 3
    a0, a1 = state.attempts["run-a0"], state.attempts["run-a1"]
    assert (a0.blocked, a0.sealed) == (199, 199)  # analysed through 199: not again
    assert a1.blocked == 19 and a1.sealed is None  # its straggler scan never ran
    assert a0.stragglers == RankStateDoc(world=4) and a0.steps == (0, 199)
    assert "tail" not in stored(state)["jobs"]["run-a0"]  # the loop comes back on arrival
    assert state.collectives == SlowCollectives() and state.bl_compute == {"n": 3}
    assert stored(state)["coll"] == {}
    assert migrate(stored(state)) == state  # the current shape goes through unchanged


@pytest.mark.parametrize("version", [4, 99, "2"])
def test_a_cursor_this_server_cannot_read_is_refused_by_name(version: object) -> None:
    with pytest.raises(CursorVersionError, match=f"version {version!r}.*up to {VERSION}"):
        migrate({"version": version, "jobs": {}})


@pytest.mark.parametrize(
    "state",
    [
        {"version": 3, "jobs": {"run-a0": {"done": "199", "blocked": 199}}},
        {"version": 3, "jobs": {"run-a0": {"blocked": 199}}},
        {"version": 2, "jobs": [], "coll": {}},
        {"version": 0},
        {"jobs": {"run-a0": {"done": 19, "hot": [["rack-1", 0]]}}},
    ],
)
def test_a_cursor_that_does_not_read_as_its_version_is_corrupt(state: dict[str, Any]) -> None:
    with pytest.raises(CursorCorruptError, match="does not read as version"):
        migrate(state)


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


def test_a_corrupt_cursor_starts_its_run_over_and_is_counted(
    bench: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    truth, _ = bench.run("straggler_persistent")
    tenant, run_id = "straggler_persistent", truth.run_id
    state = _state(bench, tenant, run_id)
    corrupt = {
        **state,
        "jobs": {j: {**js, "done": str(js["done"])} for j, js in state["jobs"].items()},
    }
    bench.store.save_cursor(tenant, run_id, -1.0, corrupt, 0)
    counts = LoopCounts()
    with caplog.at_level(logging.ERROR, logger="fleetlens.analyzer"):
        for _ in range(100):  # the run analysed again from its first step, pass after pass
            analyze_once(bench.tel, bench.store, time.time(), AnalyzerConfig(max_steps=100), counts)
            if not bench.store.runs_with_new_data():
                break
    assert counts.cursor_resets == 1
    assert f"run {run_id} analysed again from its first step" in caplog.text
    again = _state(bench, tenant, run_id)["jobs"]
    assert {j: {k: v for k, v in js.items() if k != "sc"} for j, js in again.items()} == {
        j: {k: v for k, v in js.items() if k != "sc"} for j, js in state["jobs"].items()
    }
