"""Comparing 100,000-step, 1,024-rank runs from the store: two runs, and twenty.

Storing 2 x 102M rank-step rows is too slow here, so the bench stores what the ingest path's
materialized view would have made of them, the per-step rollup ``steps_by_step`` (one row per
step, ``ranks`` = 1,024), plus each run's loss (every step) and validation loss (every 100
steps) in ``scalars``, and times ``compare_runs``: the config diff, speed, health and matched-step
queries (aggregated in SQL) and the conclusions. Keys: ``seconds`` (2 runs, goal < 1 s),
``seconds_20`` (20 runs, goal < 3 s).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit

from fleetlens.services.compare import compare_runs
from fleetlens.store.chdb_store import ChdbStore
from fleetlens.store.graph import GraphStore
from fleetlens.store.metadata import MetadataStore
from fleetlens.store.scope import Scope

RANKS = 1024


def tables(run: str, steps: int, k: int, rng: np.random.Generator) -> tuple[pa.Table, pa.Table]:
    s = np.arange(steps, dtype=np.int64)
    dur = 1.0 + 0.02 * rng.random(steps) + (0.1 if k == 1 else 0.0)
    start = 1.7e9 + np.concatenate([[0.0], np.cumsum(dur[:-1])])
    rollup = pa.table(
        {
            "tenant": ["default"] * steps,
            "run_id": [run] * steps,
            "job_id": ["j1"] * steps,
            "step": s,
            "ranks": np.full(steps, RANKS, dtype=np.uint64),
            "tokens": np.full(steps, 4_194_304, dtype=np.int64),
            "start": start,
            "end": start + dur,
            "max_duration": dur,
            "sum_duration": dur * RANKS,
            "max_compute": dur * 0.9,
            "sum_compute": dur * 0.9 * RANKS * 0.99,
            "max_data_wait": np.zeros(steps),
        }
    )
    loss = 2.1 + 8.5 * np.exp(-s / 20000.0) * (1 + 0.01 * k) + 0.01 * rng.standard_normal(steps)
    vs = s[::100]
    val = 2.2 + 8.5 * np.exp(-vs / 20000.0) * (1 + 0.01 * k)
    sc = pa.table(
        {
            "tenant": ["default"] * (steps + len(vs)),
            "project": [""] * (steps + len(vs)),
            "run_id": [run] * (steps + len(vs)),
            "job_id": ["j1"] * (steps + len(vs)),
            "step": np.concatenate([s, vs]),
            "rank": np.zeros(steps + len(vs), dtype=np.int32),
            "time": np.concatenate([start, start[::100]]),
            "name": ["loss"] * steps + ["val_loss"] * len(vs),
            "value": np.concatenate([loss, val]),
        }
    )
    return rollup, sc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="10,000-step runs")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    steps = 10_000 if args.quick else 100_000
    rng = np.random.default_rng(0)
    scope = Scope.local()
    with tempfile.TemporaryDirectory() as tmp:
        store = ChdbStore(os.path.join(tmp, "telemetry"))
        meta = MetadataStore(f"sqlite:///{tmp}/meta.db")
        try:
            g = GraphStore(meta)
            runs = [f"run-{k:02d}" for k in range(20)]
            t = time.perf_counter()
            for k, run in enumerate(runs):
                rollup, sc = tables(run, steps, k, rng)
                for name, table in (("steps_by_step", rollup), ("scalars", sc)):
                    path = os.path.join(tmp, f"{name}.parquet")
                    pq.write_table(table, path)
                    cols = ", ".join(f"`{c}`" for c in table.column_names)
                    store.command(
                        f"INSERT INTO fleetlens.{name} ({cols}) SELECT {cols} "
                        f"FROM file('{path}', Parquet)"
                    )
                meta.observe(
                    "default",
                    run,
                    job_id="j1",
                    first=1.7e9,
                    last=1.7e9 + steps,
                    step=steps - 1,
                    world_size=RANKS,
                )
                cfg = {
                    "optim": {"lr": 3e-4 * (1 + k)},
                    "global_batch_size": 512,
                    "seq_length": 8192,
                    "flops_per_token": 6 * 8e9,
                    "accelerator": "h100",
                }
                g.describe_run(scope, run, config=cfg, dataset="web:v42", code="a94df2")
            load_s = time.perf_counter() - t
            print(f"stored 20 runs x {steps:,} steps in {load_s:.1f} s", file=sys.stderr)
            two, twenty = [], []
            for _ in range(args.repeat):
                t = time.perf_counter()
                out2 = compare_runs(store, meta, scope, runs[:2])
                two.append(time.perf_counter() - t)
                t = time.perf_counter()
                compare_runs(store, meta, scope, runs)
                twenty.append(time.perf_counter() - t)
            print(out2.conclusions[0].lines, file=sys.stderr)
        finally:
            meta.close()
            store.close()
    emit(
        {
            "bench": "compare",
            "quick": args.quick,
            "seconds": min(two),
            "seconds_20": min(twenty),
            "seconds_all": two,
            "seconds_20_all": twenty,
            "steps_per_run": steps,
            "ranks": RANKS,
            "stored": "steps_by_step rollup (one row per step) + scalars (loss every step, "
            "val_loss every 100); the 1,024 rank rows per step are represented, not stored",
            "rank_step_rows_represented_per_run": steps * RANKS,
            "cause_2": out2.conclusions[0].cause,
            "goal": {"seconds": 1.0, "seconds_20": 3.0},
        }
    )


if __name__ == "__main__":
    main()
