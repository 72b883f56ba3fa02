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

pytestmark = pytest.mark.unit


@pytest.fixture
def replay(tmp_path: Path) -> Iterator[LagReplay]:
    r = LagReplay(tmp_path)
    try:
        yield r
    finally:
        r.shutdown()


@pytest.mark.e2e  # a whole job replayed pass by pass (tens of seconds)
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


@pytest.mark.e2e  # a whole job replayed pass by pass (tens of seconds)
def test_a_lagging_healthy_sender_is_not_hung(replay: LagReplay) -> None:
    played = replay.play("straggler_persistent", 300.0)
    assert played.hangs == []
    assert "JobHang" not in [a.labels["alertname"] for a in played.pages]


def test_the_ranks_named_are_the_ones_the_others_wait_for() -> None:
    """From heartbeats (time, step, phase, since): the rank idle after step 11 while the others
    are inside step 12 is behind; a rank silent for longer than the threshold while the others
    beat is frozen; everyone at one place names nobody (no one rank to blame)."""
    from fleetlens.analysis.hangs import behind_ranks

    inside = (100.0, 12, "comm", 30.0)
    assert behind_ranks({0: inside, 1: (100.0, 11, "idle", 29.0), 2: inside}, 100.0, 60.0) == [1]
    assert behind_ranks({0: inside, 1: (20.0, 12, "comm", 30.0), 2: inside}, 100.0, 60.0) == [1]
    assert behind_ranks({0: inside, 1: inside}, 100.0, 60.0) == []
    # A checkpoint after step 11 is behind the ranks already inside step 12.
    ckpt = (100.0, 11, "checkpoint", 29.0)
    assert behind_ranks({0: ckpt, 1: inside}, 100.0, 60.0) == [0]
    # Stopped (SIGSTOP) a moment after entering step 12, ahead of the others still in step 11's
    # optimizer: its position says the others are behind. Silent for 45 s while the others beat
    # every 10 s, it missed four beats: frozen, whatever the hang threshold (60 s here).
    frozen, waiting = (55.0, 12, "forward", 54.0), (100.0, 11, "optimizer", 55.0)
    beats = {0: waiting, 1: waiting, 2: frozen, 3: waiting}
    assert behind_ranks(beats, 100.0, 60.0, interval_s=10.0) == [2]
    assert behind_ranks(beats, 100.0, 60.0) == [0, 1, 3]  # how often they beat unknown
    # Two beats late is a sender's lag, not a frozen rank: the position decides.
    late = (80.0, 12, "forward", 54.0)
    assert behind_ranks({**beats, 2: late}, 100.0, 60.0, interval_s=10.0) == [0, 1, 3]
