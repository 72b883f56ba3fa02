"""Scalars that arrive after their steps were analysed (an importer sends an attempt's steps,
then its scalars; a loss logged after the step's row was sent): their verdict does not depend
on how many passes ran between the two. Such rows do not move the run's newest record time; the
loop comes back to a run when data of it arrived (the registry's count of writes, compared with
the cursor's), so however long the scalars take, their arrival is judged."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from fleetlens.testing import InProcessServer, step_batch, wait_passes, wait_until
from fleetlens.wire import TableBuilder, encode_batch

pytestmark = pytest.mark.api


def _unstable(srv: InProcessServer) -> list[dict[str, Any]]:
    found = srv.get("/v1/runs/late/diagnosis")["findings"]
    return [f for f in found if f["diagnosis"] == "instability"]


@pytest.mark.parametrize("passes", [3, 25])
def test_a_nan_loss_sent_after_its_attempts_last_step_was_analysed_is_found(
    tmp_path: Path, passes: int
) -> None:
    env = {"FLEETLENS_ANALYSIS_INTERVAL_S": "0.1"}
    with InProcessServer(str(tmp_path / "data"), env=env) as srv:
        t0 = time.time() - 3600
        ctx = {"run_id": "late", "job_id": "late-a0", "project": "llm"}
        ev = TableBuilder("event")  # how the attempt ended comes first, as an importer sends it
        ev.add("time", [t0 + 21.0]).add("kind", ["failure"]).add("step", [40])
        assert srv.post(encode_batch({"event": ev.build()}, ctx)[1])[0] == 200
        body = step_batch("late", range(0, 40), 2, job_id="late-a0", t0=t0, base=0.5)[1]
        assert srv.post(body)[0] == 200
        wait_until(lambda: srv.get("/v1/runs/late")["step"] == 39, timeout=60)
        # The attempt's steps are judged: nothing is wrong with them. Then the scalars come a
        # few passes later, or many (more than any count of passes the loop would wait).
        wait_passes(srv, passes)
        assert not _unstable(srv)
        # Then its losses, the last one NaN: the step that never completed (no row of its own).
        sc = TableBuilder("scalar")
        steps = list(range(0, 41))
        sc.add("step", steps).add("time", [t0 + 0.5 * s for s in steps])
        sc.add("name", ["loss"] * len(steps))
        sc.add("value", [2.0] * 40 + [float("nan")])
        assert srv.post(encode_batch({"scalar": sc.build()}, ctx)[1])[0] == 200
        found = wait_until(lambda: _unstable(srv), timeout=60)
        assert found[0]["step"] == 40, found
