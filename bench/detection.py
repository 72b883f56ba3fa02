"""Detection quality and speed: precision and recall per fault type on the simulator library,
steps to flag a 15% straggler among 1,024 ranks (3% noise), one step of 16,384 ranks analysed,
and the ranks endpoint's window query for 16,384 ranks x 100 steps in chDB.

Keys: ``min_precision``, ``min_recall`` (worst fault type), ``straggler_detect_steps``,
``step_analysis_ms_16k``, ``ranks_query_ms``; ``lag_false_hangs`` / ``lag_missed_hangs``
(scenarios played with the sender up to 5 minutes behind its own timestamps);
``verdict_consistency`` (share of runs whose straggler findings are identical live, in
bursts, out of order and at once; every finding: ``verdict_consistency_all_kinds``; all
but hangs: ``verdict_consistency_but_hangs``). ``--quick`` runs fewer scenarios and
repeats.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import emit

from bench._detect_harness import SCENARIOS, Bench
from bench._lag_replay import LagReplay
from fleetlens.analysis.ranks import RankState, open_episodes, scan_stragglers, step_stats
from fleetlens.services.runs import RunQueries
from fleetlens.sim.truth import score_detections
from fleetlens.store.chdb_store import ChdbStore
from fleetlens.store.scope import Scope


def quality(scenarios: list[str]) -> tuple[dict[str, dict[str, float]], float]:
    per: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as d:
        b = Bench(Path(d))
        try:
            for name in scenarios:
                truth, rows = b.run(name)
                dets = [{k: r[k] for k in ("diagnosis", "ranks", "nodes", "time", "step")}
                        for r in rows]  # fmt: skip
                sc = score_detections(truth, dets)
                owners_ok = all(
                    any(r["diagnosis"] == f.diagnosis and r["owner"] == f.owner for r in rows)
                    for f in truth.faults
                )
                for f in truth.faults:
                    per[f.kind] = {"precision": sc.precision, "recall": sc.recall,
                                   "steps_to_detect": sc.steps_to_detect.get(f.id, -1),
                                   "owner_ok": float(owners_ok)}  # fmt: skip
                print(f"{name:<24} P {sc.precision:.2f} R {sc.recall:.2f} "
                      f"steps {sc.steps_to_detect}", file=sys.stderr)  # fmt: skip
            truth, rows = b.run("healthy_24h", run_id="healthy")
            healthy = len([r for r in rows if r["kind"] in ("straggler", "hang")])
            print(f"healthy_24h findings {len(rows)} (straggler/hang {healthy})", file=sys.stderr)
        finally:
            b.close()
    return per, float(healthy)


def lag_false_hangs(scenarios: list[str], lags: list[float]) -> dict[str, int]:
    """Play scenarios with the sender up to 5 minutes behind its own timestamps through ingest
    and the monitoring pass: hang findings and JobHang alerts beyond the injected hangs
    (``lag_false_hangs``), and injected hangs not found (``lag_missed_hangs``)."""
    false, missed = 0, 0
    with tempfile.TemporaryDirectory() as d:
        r = LagReplay(Path(d))
        try:
            for lag in lags:
                for name in scenarios:
                    p = r.play(name, lag)
                    false += p.false_hangs()
                    missed += 0 if p.hang_found() else 1
                    print(f"lag {lag:>5.0f}s {name:<22} false hangs {p.false_hangs()} "
                          f"hang found {p.hang_found()}", file=sys.stderr)  # fmt: skip
        finally:
            r.shutdown()
    return {"lag_false_hangs": false, "lag_missed_hangs": missed}


def straggler_steps(reps: int) -> int:
    worst = 0
    for seed in range(reps):
        rng = np.random.default_rng(seed)
        x = 1.0 + 0.03 * rng.standard_normal((30, 1024))
        x[:, 100] *= 1.15
        st = scan_stragglers(np.arange(30), x, RankState.fresh(1024))
        eps = [e for e in open_episodes(st) + st.episodes if e.rank == 100]
        worst = max(worst, eps[0].detected + 1 if eps else 10**6)
    return worst


def step_ms(reps: int) -> float:
    rng = np.random.default_rng(0)
    x = 1.0 + 0.03 * rng.standard_normal((reps, 16384))
    st = RankState.fresh(16384)
    t0 = time.perf_counter()
    for i in range(reps):
        step_stats(x[i])
        scan_stragglers(np.array([i]), x[i : i + 1], st)
    return (time.perf_counter() - t0) / reps * 1000.0


def ranks_query_ms(reps: int) -> float:
    w, k = 16384, 100
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as d:
        store = ChdbStore(d)
        try:
            comp = 0.9 * (1 + 0.015 * rng.standard_normal(w * k))
            tab = pa.table({
                "step": np.repeat(np.arange(k, dtype=np.int64), w),
                "rank": np.tile(np.arange(w, dtype=np.int32), k),
                "time": np.repeat(1.7e9 + np.arange(k, dtype=np.float64), w),
                "duration": np.full(w * k, 1.0), "forward": comp * 0.32,
                "backward": comp * 0.62, "optimizer": comp * 0.06,
                "comm": 1.0 - comp, "data_wait": np.full(w * k, 0.004),
            })  # fmt: skip
            store.insert("step", tab, {"tenant": "default", "run_id": "big", "job_id": "a0"}, "b1")
            q = RunQueries(store, Scope.local())
            q.ranks("big", 0, k - 1, "compute", True, 100)
            t0 = time.perf_counter()
            for _ in range(reps):
                q.ranks("big", 0, k - 1, "compute", True, 100)
            return (time.perf_counter() - t0) / reps * 1000.0
        finally:
            store.close()


def verdict_consistency(runs: int) -> dict[str, float]:
    """Share of runs whose findings are the same live, in bursts, out of order and at once
    (bench/_delivery.py): straggler findings (``verdict_consistency``), every finding
    (``verdict_consistency_all_kinds``), every finding but hangs (``..._but_hangs``: a hang is
    judged against the clock, which a lagging sender moves; issue 18 item 2)."""
    from bench._delivery import MODES, Player, Way, findings_verdict, record, straggler_verdict

    names = ["straggler_persistent", "straggler_intermittent", "straggler_moving"]
    same = same_all = same_no_hangs = 0
    with tempfile.TemporaryDirectory() as d:
        p = Player(Path(d))
        try:
            for i in range(runs):
                rec = record(names[i % len(names)], 600, seed=100 + i)
                rng = np.random.default_rng(i)
                plays = [p.play(rec, Way(m, seed=i, max_lag=int(rng.integers(1, 60)),
                                         tick=int(rng.integers(3, 25)),
                                         chunks=int(rng.integers(2, 30))))
                         for m in MODES]  # fmt: skip
                verdicts = [straggler_verdict(rows) for rows in plays]
                every = [findings_verdict(rows) for rows in plays]
                no_hangs = [findings_verdict(rows, skip=("hang",)) for rows in plays]
                same += all(v == verdicts[0] for v in verdicts)
                same_all += all(v == every[0] for v in every)
                same_no_hangs += all(v == no_hangs[0] for v in no_hangs)
                print(f"verdict {rec.run_id} seed {100 + i}: "
                      f"{dict(zip(MODES, verdicts, strict=True))}", file=sys.stderr)  # fmt: skip
        finally:
            p.close()
    return {
        "verdict_consistency": same / runs,
        "verdict_consistency_all_kinds": same_all / runs,
        "verdict_consistency_but_hangs": same_no_hangs / runs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    scen = SCENARIOS[:6] if args.quick else SCENARIOS
    per, healthy = quality(scen)
    result = {
        "min_precision": min(v["precision"] for v in per.values()),
        "min_recall": min(v["recall"] for v in per.values()),
        "owners_ok": all(v["owner_ok"] == 1.0 for v in per.values()),
        "healthy_straggler_or_hang_findings": healthy,
        "straggler_detect_steps": straggler_steps(5 if args.quick else 50),
        "step_analysis_ms_16k": round(step_ms(20 if args.quick else 200), 3),
        "per_fault": per,
    }
    # chDB: one engine per process; the quality run closed its store above
    lag_scn = (
        ["hang", "straggler_persistent"]
        if args.quick
        else ["hang", "ecc_xid", "fatal_xid", "straggler_persistent", "preemption", "maintenance"]
    )
    result.update(lag_false_hangs(lag_scn, [300.0] if args.quick else [30.0, 120.0, 300.0]))
    result["ranks_query_ms"] = round(ranks_query_ms(3 if args.quick else 10), 1)
    result.update(verdict_consistency(3 if args.quick else 12))
    emit(result)


if __name__ == "__main__":
    main()
