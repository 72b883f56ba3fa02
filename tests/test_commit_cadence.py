"""The group commit's quiet spell adapts to how requests arrive (issue 35): a client that waits
for each answer is answered after ``gap_s``; many senders whose requests come before the ones
ahead of them were answered share inserts, the gap stretching to three of their spacings."""

from __future__ import annotations

import pytest

from fleetlens.collector.commit import Cadence

pytestmark = pytest.mark.unit

GAP, LINGER = 0.01, 0.5


def test_a_client_waiting_for_each_answer_keeps_the_short_gap() -> None:
    c = Cadence()
    for i in range(200):  # one request every 20 ms, none while another is unanswered
        c.arrived(i * 0.02, unanswered=0)
    assert c.gap(GAP, LINGER) == GAP


def test_64_ranks_sending_once_a_second_stretch_the_gap_to_three_spacings() -> None:
    c = Cadence()
    for i in range(200):  # a request every 1/64 s, each before the one ahead was answered
        c.arrived(i / 64, unanswered=1)
    assert c.gap(GAP, LINGER) == pytest.approx(3 / 64, rel=1e-3)  # ~47 ms, not 10


def test_the_gap_never_passes_the_linger_and_returns_when_the_senders_go() -> None:
    c = Cadence()
    for i in range(100):  # a few senders, a second apart, each unanswered when the next comes
        c.arrived(float(i), unanswered=2)
    assert c.gap(GAP, LINGER) == LINGER
    t = 100.0
    for _ in range(7):  # then one client alone: after a handful of its requests, the short gap
        t += 0.05
        c.arrived(t, unanswered=0)
    assert c.gap(GAP, LINGER) == GAP
