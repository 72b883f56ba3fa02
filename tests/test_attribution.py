"""Per-finding cost: the breakdown's loss lines split over the findings, summing exactly."""

from __future__ import annotations

import numpy as np
import pytest

from fleetlens.analysis.attribution import LOSS_LINES, FindingWindow, attribute, severity
from fleetlens.analysis.breakdown import CATEGORIES, Breakdown

pytestmark = pytest.mark.unit


def _breakdown(**seconds: float) -> Breakdown:
    return Breakdown(
        t0=0.0,
        t1=1000.0,
        seconds={c: seconds.get(c, 0.0) for c in CATEGORIES},
        unheld={},
        rework_by_cause={"failure": 30.0, "preemption": 10.0, "maintenance": 0.0},
        retained_steps=10.0,
        reworked_executions=2,
        attempts=2,
        interruptions={"recovery": 1},
        checkpoints=0,
        tolerance=0.01,
    )


def test_each_line_is_split_over_the_findings_that_explain_it_and_sums_exactly() -> None:
    bd = _breakdown(
        productive=700.0, straggler=100.0, data_stall=20.0, recovery=50.0, rework=40.0, startup=9.0
    )
    step = np.arange(10, dtype=np.int64)
    raw = {
        # steps 0-4: 1 s each above the mean rank; steps 5-9: 3 s each (the line is 100 s)
        "straggler": np.array([1.0] * 5 + [3.0] * 5),
        "data_stall": np.array([0.0] * 8 + [1.0, 1.0]),
    }
    findings = [
        FindingWindow("slow", "straggler", "straggler.persistent", 0, None, 1.1),
        FindingWindow("hot", "straggler", "thermal", 5, 7, 1.3),  # more severe: owns 5-7
        FindingWindow("xid", "failure", "fatal_xid", 6, 7, 0.95),
        FindingWindow("data", "slowdown", "data_stall", 9, 9, 5.0),
    ]
    got = attribute(findings, bd, step, raw)
    # The straggler line: 100 s over a raw 20 s, so 5 s per raw second.
    assert got.by_finding["hot"] == pytest.approx({"straggler": 3 * 3 * 5.0})
    assert got.by_finding["slow"] == pytest.approx({"straggler": (5 * 1 + 2 * 3) * 5.0})
    assert got.by_finding["data"] == pytest.approx({"data_stall": 10.0})
    # Recovery and the failures' 3/4 of rework (30 of 40 s by cause) go to the failure.
    assert got.by_finding["xid"] == pytest.approx({"recovery": 50.0, "rework": 30.0})
    assert got.unattributed == pytest.approx({"data_stall": 10.0, "rework": 10.0, "startup": 9.0})
    for line in LOSS_LINES:
        total = sum(f.get(line, 0.0) for f in got.by_finding.values())
        assert total + got.unattributed.get(line, 0.0) == pytest.approx(bd.seconds[line]), line


def test_a_run_without_findings_leaves_every_loss_unattributed() -> None:
    bd = _breakdown(productive=10.0, straggler=4.0, checkpoint=2.0)
    got = attribute([], bd, np.arange(3, dtype=np.int64), {"straggler": np.ones(3)})
    assert got.by_finding == {}
    assert got.unattributed == pytest.approx({"straggler": 4.0, "checkpoint": 2.0})


def test_severity_is_the_first_evidence_ratio_else_the_confidence() -> None:
    assert severity([{"metric": "x"}, {"value": 1.2, "baseline": 1.0}], 0.8) == pytest.approx(1.2)
    assert severity([{"value": 79}], 0.95) == 0.95
