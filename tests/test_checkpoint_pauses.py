"""A checkpoint save as the SDK reports it (``run.checkpoint(step, duration_s=...)`` on every
rank: a ``checkpoint_end`` whose ``duration_s`` is the pause) is a slow save when it takes far
longer than the run's earlier ones, and its pause is charged to checkpointing in the run's
goodput, counted once however many ranks report it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from fleetlens.analysis.timeline import Event, checkpoint_saves, save_pauses
from fleetlens.testing import InProcessServer, step_batch, wait_until
from fleetlens.wire import TableBuilder, encode_batch

RANKS = 2
PAUSES = (2.0, 2.0, 12.0)  # the saves after steps 19, 39 and 59


def _post_saves(srv: InProcessServer, run: str, t0: float) -> None:
    """80 steps of 0.4 s on 2 ranks in four stretches of 20; between two stretches every rank
    saves (a plain ``run.checkpoint`` call once the save returned, so the event's time is the
    end of the pause)."""
    t, times, steps = t0, [], []
    for i in range(4):
        stretch = range(20 * i, 20 * i + 20)
        body = step_batch(run, stretch, RANKS, base=0.4, t0=t, ctx={"project": "test"})[1]
        assert srv.post(body)[0] == 200
        t += 20 * 0.48
        if i < len(PAUSES):
            t += PAUSES[i]
            times.append(t)
            steps.append(stretch[-1])
    ev = TableBuilder("event")
    n = len(times) * RANKS
    ev.add("time", [x for x in times for _ in range(RANKS)])
    ev.add("step", [s for s in steps for _ in range(RANKS)])
    ev.add("kind", ["checkpoint_end"] * n).add("rank", list(range(RANKS)) * len(times))
    attrs = [
        {"path": f"/ckpt/{s}", "sync": True, "ok": True, "duration_s": p}
        for s, p in zip(steps, PAUSES, strict=True)
        for _ in range(RANKS)
    ]
    ev.add("attrs", [json.dumps(a) for a in attrs])
    ctx = {"run_id": run, "job_id": "j1", "project": "test"}
    assert srv.post(encode_batch({"event": ev.build()}, ctx)[1])[0] == 200


def _end(t: float, step: int, rank: int, **attrs: Any) -> Event:
    return Event(t, "checkpoint_end", "j1", step, {"sync": True, "ok": True, **attrs}, rank)


@pytest.mark.unit
def test_a_save_is_one_however_many_ranks_report_it_and_only_synchronous_good_ones_pause() -> None:
    """Two ranks report each save. A decorated save function reports the step it was decorated
    with every time, and a save with no step reports -1: one rank's reports of the same step
    are each a save. A background save and a failed one are saves but no pause."""
    evs = [
        _end(10, 19, 0, duration_s=2.0), _end(10.1, 19, 1, duration_s=2.5),  # one save
        _end(20, 5, 0, duration_s=1.0), _end(20, 5, 1, duration_s=1.0),  # a decorated save
        _end(30, 5, 1, duration_s=3.0), _end(30, 5, 0, duration_s=1.0),  # ... called again
        _end(40, -1, 0, duration_s=1.0), _end(50, -1, 0, duration_s=4.0),  # two, no step
        _end(60, 70, 0, duration_s=60.0, sync=False), _end(60, 70, 1, duration_s=60.0, sync=False),
        _end(70, 80, 0, duration_s=9.0, ok=False), _end(70, 80, 1, duration_s=9.0, ok=False),
    ]  # fmt: skip
    assert [[e.time for e in s] for s in checkpoint_saves(evs)] == [
        [10, 10.1], [20, 20], [30, 30], [40], [50], [60, 60], [70, 70]
    ]  # fmt: skip
    assert save_pauses(evs) == ([19, 5, 5, -1, -1], [2.5, 1.0, 3.0, 1.0, 4.0],
                                [10.1, 20, 30, 40, 50])  # fmt: skip


@pytest.mark.api
def test_a_slow_save_reported_with_duration_s_is_a_finding_and_its_pause_is_checkpointing(
    tmp_path: Path,
) -> None:
    with InProcessServer(str(tmp_path / "data"), settings={"analysis_interval_s": 0.2}) as srv:
        _post_saves(srv, "ck", time.time() - 600)

        def slow() -> dict[str, Any] | None:
            found = srv.get("/v1/runs/ck/diagnosis")["findings"]
            got = [f for f in found if f["diagnosis"] == "slow_checkpoint"]
            return got[0] if got else None

        f = wait_until(slow, timeout=60)
        assert f["owner"] == "storage" and f["step"] == 59, f
        assert "12.0s vs 2.0s" in f["summary"], f
        found = srv.get("/v1/runs/ck/diagnosis")["findings"]
        assert sum(g["diagnosis"] == "slow_checkpoint" for g in found) == 1, found

        bd = srv.get("/v1/runs/ck/goodput")["breakdown"]
        lines = {ln["category"]: ln["seconds"] for ln in bd["lines"]}
        assert lines["checkpoint"] == pytest.approx(sum(PAUSES), abs=0.01), lines
        assert bd["checkpoints"] == len(PAUSES), bd
