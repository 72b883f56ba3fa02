"""Hangs judged on the run's own clock, not on delivery (issue 18, item 2).

The simulator's runs are played through the real ingest path and the server's monitoring pass
(analysis, alert policy) with the sender up to five minutes behind its own timestamps. Before,
every pass found a "hang" as long as the lag (22 at 5 minutes in the hang scenario, and JobHang
pages). Now the hangs found are the ones injected, named, whatever the lag.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench._lag_replay import LagReplay


@pytest.fixture
def replay(tmp_path: Path) -> Iterator[LagReplay]:
    r = LagReplay(tmp_path)
    try:
        yield r
    finally:
        r.shutdown()


@pytest.mark.parametrize("lag", [0.0, 300.0])
def test_the_injected_hang_and_only_it_is_found_whatever_the_senders_lag(
    replay: LagReplay, lag: float
) -> None:
    played = replay.play("hang", lag)
    (fault,) = [f for f in played.truth.faults if f.kind == "hang"]
    (hang,) = played.hangs
    assert (hang.step, hang.ranks) == (fault.start_step, fault.ranks)
    pages = [a.labels["alertname"] for a in played.pages if a.labels["severity"] == "page"]
    assert pages == ["JobHang"]
    assert played.false_hangs() == 0


def test_a_lagging_healthy_sender_is_not_hung(replay: LagReplay) -> None:
    played = replay.play("straggler_persistent", 300.0)
    assert played.hangs == []
    assert "JobHang" not in [a.labels["alertname"] for a in played.pages]
