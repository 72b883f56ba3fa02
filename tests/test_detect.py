"""Detection quality on simulator scenarios with ground truth, through the real ingest path,
chDB and the analysis loop; and the analyses against real data (XID catalog, NCCL flight
recorder dumps)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench._detect_harness import SCENARIOS, Bench
from fleetlens.analysis.baseline import Baseline, localize
from fleetlens.analysis.collectives import analyze_collectives
from fleetlens.analysis.flight_recorder_dump import load_dump
from fleetlens.analysis.hangs import find_stalls, flight_recorder_groups, missing_from_groups
from fleetlens.analysis.ranks import RankState, open_episodes, scan_stragglers
from fleetlens.analysis.stragglers import classify_episodes
from fleetlens.analysis.xid import classify_xid, xid_catalog
from fleetlens.sim.truth import score_detections

pytestmark = pytest.mark.unit

REAL = Path(__file__).resolve().parent / "data" / "real"
FR = REAL / "nccl_flight_recorder" / "nvidia_resiliency_ext_16rank"


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    b = Bench(tmp_path_factory.mktemp("detect"))
    try:
        yield b
    finally:
        b.close()


def _dets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: r[k] for k in ("diagnosis", "ranks", "nodes", "time", "step")} for r in rows]


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_found_with_its_owner_and_nothing_else(bench: Bench, name: str) -> None:
    truth, rows = bench.run(name)
    score = score_detections(truth, _dets(rows))
    assert score.recall == 1.0, (name, rows)
    assert score.precision == 1.0, (name, rows)
    for f in truth.faults:
        match = [r for r in rows if r["diagnosis"] == f.diagnosis]
        assert match and all(r["owner"] == f.owner for r in match)
        assert all(r["evidence"] for r in match)


def test_healthy_run_has_no_straggler_or_hang(bench: Bench) -> None:
    truth, rows = bench.run("healthy_24h", steps=1500, run_id="healthy-short")
    assert truth.faults == []
    assert [r for r in rows if r["kind"] in ("straggler", "hang")] == []
    assert rows == []


def test_persistent_straggler_of_1024_ranks_flagged_within_5_steps() -> None:
    rng = np.random.default_rng(3)
    steps = []
    for _ in range(20):
        x = 1.0 + 0.03 * rng.standard_normal((40, 1024))
        x[:, 611] *= 1.15
        st = scan_stragglers(np.arange(40), x, RankState.fresh(1024))
        eps = open_episodes(st) + st.episodes
        assert [e.rank for e in eps] == [611]
        steps.append(eps[0].detected + 1)
    assert max(steps) <= 5
    c = classify_episodes(eps)
    assert c[0].diagnosis == "straggler.persistent" and abs(c[0].slowdown - 0.15) < 0.02


def test_moving_and_intermittent_are_told_apart() -> None:
    rng = np.random.default_rng(4)
    x = 1.0 + 0.015 * rng.standard_normal((600, 64))
    for k in range(12):
        x[k * 50 : (k + 1) * 50, (k * 7) % 64] *= 1.25
    st = scan_stragglers(np.arange(600), x, RankState.fresh(64))
    assert [c.diagnosis for c in classify_episodes(st.episodes)] == ["straggler.moving"]
    y = 1.0 + 0.015 * rng.standard_normal((600, 64))
    for a in range(0, 600, 150):
        y[a : a + 40, 5] *= 1.3
    st = scan_stragglers(np.arange(600), y, RankState.fresh(64))
    (c,) = classify_episodes(st.episodes)
    assert c.diagnosis == "straggler.intermittent" and c.episodes == 4 and c.ranks == (5,)


def test_a_small_steady_slowdown_in_noise_is_one_persistent_spell() -> None:
    """10 % slower for good, in 5 % noise (generated fleets 14, 61, 134): 2 sigma, under the
    fast lane's k, whose evidence falls back to 0 now and then. When it does, the slow lane
    flags the rank again and holds that episode open while it stays slow: persistent, dated
    from its onset. Slow in spells of 20 steps with healthy gaps, it is intermittent."""
    rng = np.random.default_rng(6)
    x = 1.0 + 0.05 * rng.standard_normal((360, 16))
    x[60:, 3] *= 1.10
    st = scan_stragglers(np.arange(360), x, RankState.fresh(16))
    eps = st.episodes + open_episodes(st)
    assert {e.rank for e in eps} == {3} and len(eps) <= 3 and abs(eps[0].start - 60) <= 5, eps
    assert eps[-1].end == -1 and eps[-1].steps > 250, eps
    (c,) = classify_episodes(eps)
    assert c.diagnosis == "straggler.persistent" and c.ranks == (3,) and c.episodes == 1, c
    assert abs(c.start - 60) <= 5 and c.end == eps[-1].end, c
    y = 1.0 + 0.05 * rng.standard_normal((360, 16))
    for a in range(60, 360, 55):
        y[a : a + 20, 3] *= 1.15
    st = scan_stragglers(np.arange(360), y, RankState.fresh(16))
    eps = st.episodes + open_episodes(st)
    assert all(abs(e.before) < 0.03 for e in eps[1:] if e.before is not None), eps
    (c,) = classify_episodes(eps)
    assert c.diagnosis == "straggler.intermittent" and c.episodes >= 4, c


def test_a_faint_intermittent_straggler_in_noise_is_found_from_its_first_spell() -> None:
    """11 % slower in spells of 18 steps, in 5 % noise (generated fleets 161, 195): 2.2 sigma
    is under the fast lane's k, so no spell was seen. The slow lane flags each spell within
    about 12 steps of its onset and lets go when it ends; 64 healthy ranks in the same noise
    for 2,000 steps give no episode at all."""
    rng = np.random.default_rng(11)
    x = 1.0 + 0.05 * rng.standard_normal((320, 32))
    spells = [(94, 112), (155, 171), (207, 229)]
    for a, b in spells:
        x[a:b, 23] *= 1.11
    st = scan_stragglers(np.arange(320), x, RankState.fresh(32))
    eps = st.episodes + open_episodes(st)
    assert [e.rank for e in eps] == [23, 23, 23], eps
    for e, (a, b) in zip(eps, spells, strict=True):
        assert abs(e.start - a) <= 5 and e.detected - a <= 16 and abs(e.end - b) <= 8, (e, a, b)
    (c,) = classify_episodes(eps)
    assert c.diagnosis == "straggler.intermittent" and c.ranks == (23,) and c.episodes == 3, c
    healthy = 1.0 + 0.05 * rng.standard_normal((2000, 64))
    st = scan_stragglers(np.arange(2000), healthy, RankState.fresh(64))
    assert st.episodes + open_episodes(st) == []


def test_a_slow_rank_handed_over_once_is_a_moving_straggler_from_the_handover() -> None:
    """Two turns of a moving straggler seen (generated fleet 149: its other turns fell on a hot
    GPU): rank 4 slow, then rank 9 from where rank 4 recovered. Moving over the two, known when
    rank 9 is flagged; two ranks slow at unrelated times stay two stragglers."""
    rng = np.random.default_rng(8)
    x = 1.0 + 0.015 * rng.standard_normal((300, 16))
    x[100:150, 4] *= 1.2
    x[150:200, 9] *= 1.2
    st = scan_stragglers(np.arange(300), x, RankState.fresh(16))
    (c,) = classify_episodes(st.episodes + open_episodes(st))
    assert c.diagnosis == "straggler.moving" and c.ranks == (4, 9), c
    assert abs(c.start - 100) <= 3 and 150 <= c.detected <= 155, c
    y = 1.0 + 0.015 * rng.standard_normal((300, 16))
    y[100:150, 4] *= 1.2
    y[180:230, 9] *= 1.2
    st = scan_stragglers(np.arange(300), y, RankState.fresh(16))
    found = classify_episodes(st.episodes + open_episodes(st))
    assert [(c.diagnosis, c.ranks) for c in found] == [
        ("straggler.persistent", (4,)),
        ("straggler.persistent", (9,)),
    ], found


def test_a_handover_is_seen_beside_a_straggler_that_began_with_it() -> None:
    """Generated fleet 62 run 1: a persistent straggler began 4 steps before the moving
    straggler's second turn (dated right by the slow lane). It is a straggler of its own, no
    group slowing together with that turn: the moving straggler is still known when the second
    turn is flagged, not only at the third."""
    rng = np.random.default_rng(12)
    x = 1.0 + 0.015 * rng.standard_normal((320, 16))
    for r, a in ((4, 100), (9, 150), (13, 200), (14, 250)):
        x[a : a + 50, r] *= 1.2
    x[147:, 12] *= 1.15
    st = scan_stragglers(np.arange(320), x, RankState.fresh(16))
    found = {c.diagnosis: c for c in classify_episodes(st.episodes + open_episodes(st))}
    assert set(found) == {"straggler.moving", "straggler.persistent"}, found
    moving, own = found["straggler.moving"], found["straggler.persistent"]
    assert moving.ranks == (4, 9, 13, 14) and 150 <= moving.detected <= 155, moving
    assert own.ranks == (12,) and abs(own.start - 147) <= 3, own


def test_moving_straggler_beside_an_intermittent_one_and_two_long_ones() -> None:
    """Several faults at once (generated fleets 151, 152): the turns of a moving straggler
    overlap an intermittent straggler's episodes and two persistent stragglers that began at
    different times; the turns are still one moving straggler."""
    rng = np.random.default_rng(9)
    x = 1.0 + 0.015 * rng.standard_normal((400, 24))
    for k in range(6):  # turns on ranks 10, 11, ..., 15
        x[60 + 50 * k : 110 + 50 * k, 10 + k] *= 1.15
    for a in range(30, 400, 63):
        x[a : a + 20, 3] *= 1.25
    x[20:, 7] *= 1.1
    x[100:300, 8] *= 1.15
    st = scan_stragglers(np.arange(400), x, RankState.fresh(24))
    found = {c.ranks: c.diagnosis for c in classify_episodes(st.episodes + open_episodes(st))}
    assert found == {
        (10, 11, 12, 13, 14, 15): "straggler.moving",
        (3,): "straggler.intermittent",
        (7,): "straggler.persistent",
        (8,): "straggler.persistent",
    }, found


def test_moving_straggler_beside_a_persistent_one_is_still_moving() -> None:
    """Several faults at once (found by the generated scenarios of bench/detection.py): a rank
    slow for most of the run does not stop the ranks that take turns from being one moving
    straggler, and is its own persistent straggler."""
    rng = np.random.default_rng(6)
    x = 1.0 + 0.015 * rng.standard_normal((600, 64))
    for k in range(12):
        x[k * 50 : (k + 1) * 50, (k * 7) % 64] *= 1.25
    x[100:, 40] *= 1.2
    st = scan_stragglers(np.arange(600), x, RankState.fresh(64))
    found = {c.diagnosis: c for c in classify_episodes(st.episodes + open_episodes(st))}
    assert sorted(found) == ["straggler.moving", "straggler.persistent"], found
    assert 40 not in found["straggler.moving"].ranks
    assert found["straggler.persistent"].ranks == (40,)
    assert abs(found["straggler.persistent"].start - 100) <= 5


def test_rack_throttling_caught_by_absolute_check_and_localized() -> None:
    rng = np.random.default_rng(5)
    racks = [f"rack-{r // 256:02d}" for r in range(2048)]
    nodes = [f"n{r // 8:04d}" for r in range(2048)]
    b = Baseline()
    b.add(1.0 + 0.004 * rng.standard_normal(200))
    vals = 1.0 + 0.01 * rng.standard_normal(2048)
    vals[512:712] *= 1.08  # 200 GPUs in rack-02 throttle together
    med = np.median(vals)
    assert (vals.max() - med) / med < 0.2  # peer-relative spread stays ordinary
    (sh,) = localize(vals, b, {"rack": racks, "node": nodes})
    assert sh.level == "rack" and sh.group == "rack-02" and sh.ratio == pytest.approx(1.08, 0.01)
    assert localize(1.0 + 0.01 * rng.standard_normal(2048), b, {"rack": racks}) == []
    # Two slow ranks of one node of four (a straggler and a moving straggler's turn) are two
    # ranks' faults: the node's median is halfway up, but most of its ranks are on time.
    four = [f"n{r // 4}" for r in range(64)]
    vals = 1.0 + 0.004 * rng.standard_normal(64)
    vals[[13, 14]] *= 1.30
    assert localize(vals, b, {"node": four}) == []
    vals[12] *= 1.30  # three of the four: the node is slow
    (sh,) = localize(vals, b, {"node": four})
    assert (sh.level, sh.group, sh.ranks) == ("node", "n3", (12, 13, 14, 15))


def test_collectives_slow_rank_vs_slow_network_without_clocks() -> None:
    ranks = np.tile(np.arange(8), 2)
    seq = np.repeat([1, 2], 8)
    skew = np.tile(np.arange(8) * 5.0, 2)  # clocks off by seconds: enter times are useless
    inside = np.array([0.5] * 8 + [0.2] * 8)
    inside[3] = 0.1  # collective 1: rank 3 arrived last, the others waited 0.4 s
    rep = analyze_collectives(seq, seq, ranks, skew, skew + inside, baseline_transfer_s=0.1)
    assert rep.last_rank[0] == 3 and rep.verdict == ["slow_rank", "slow_network"]


def test_stall_names_the_gap_and_ignores_explained_stops() -> None:
    ends = np.arange(100.0)
    (s,) = find_stalls(ends, 500.0, 60.0)
    assert (s.since, s.detected_at) == (99.0, 159.0)
    assert find_stalls(ends, 500.0, 60.0, explained_ends=np.array([101.0])) == []


@pytest.mark.parametrize(
    ("scenario", "missing"), [("gpu_error_1st", {12}), ("lock_gil_1st", {9, 14})]
)
def test_flight_recorder_hang_attribution(scenario: str, missing: set[int]) -> None:
    """Real PyTorch NCCL flight recorder dumps of a 16-rank job with injected faults."""
    files = [FR / scenario / f"_dump_{r}.json" for r in range(16)]
    dumps = {r: load_dump(f.read_bytes(), f.name) for r, f in enumerate(files)}
    stuck = missing_from_groups(*flight_recorder_groups(dumps, 16))
    assert set().union(*(s.missing for s in stuck)) == missing
    ref = (FR / scenario / "reference_output.txt").read_text().splitlines()[1].split("|")
    group, op = ref[0].strip(), ref[2].strip()
    hit = [s for s in stuck if s.group == group]
    assert hit and hit[0].op == op
    assert set(hit[0].missing) == {int(x) for x in ref[-1].split(",")}


def test_xid_classes_come_from_the_catalog() -> None:
    cat = xid_catalog()
    assert len(cat) == 172
    assert classify_xid(79).severity == "fatal" and not classify_xid(79).ecc
    assert classify_xid(48).severity == "fatal" and classify_xid(48).ecc
    assert classify_xid(13).severity == "application"
    assert classify_xid(63).severity == "recoverable"
    assert classify_xid(99999).severity == "unknown"
    real = (REAL / "xid_catalog" / "nvsentinel_xiderrorsmapping.csv").read_text().splitlines()
    for line in real:
        xid, _m, _a, sev = (p.strip() for p in line.split(",")[:4])
        if xid.isdigit() and int(xid) in cat and sev in ("FATAL", "NONFATAL"):
            assert (cat[int(xid)].severity == "fatal") == (sev == "FATAL"), xid
