"""Simulator rate: records generated per second in process, and ingested end to end.

``records_per_s``: every record kind of the ``demo`` scenario (256 ranks) generated and encoded
to wire batches in this process (no I/O). ``rank_steps_per_s``: the per-rank step records alone
over the same time. ``ingested_records_per_s``: the same scenario posted to an embedded server
(bench/_common.start_server) and acknowledged. Goal: >= 1,000,000 rank-steps/s generated.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, start_server, stop_server

from fleetlens.sim import load_scenario, run_scenario
from fleetlens.sim.emit import encode


class EncodeSink:
    """Encode each batch as the wire would carry it, then drop it."""

    def __init__(self) -> None:
        self.bytes = 0

    def send(self, ctx: dict[str, str], tables: dict[str, tuple[int, Any]]) -> None:
        self.bytes += len(encode(ctx, tables))

    def close(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small run for CI (a few seconds)")
    ap.add_argument("--steps", type=int, default=12_000)
    args = ap.parse_args()
    steps = 1500 if args.quick else args.steps
    scn = load_scenario("demo")
    scn = replace(scn, job=replace(scn.job, steps=steps, run_id="bench-sim"))
    sink = EncodeSink()
    t0 = time.perf_counter()
    res = run_scenario(scn, sink=sink, speed=0)
    gen = time.perf_counter() - t0
    records = sum(res.records.values())
    print(f"generated {records:,} records ({res.records['step']:,} rank-steps, "
          f"{sink.bytes / 1e6:.0f} MB) in {gen:.2f}s", file=sys.stderr)  # fmt: skip
    ing_steps = min(steps, 1500 if args.quick else 6000)
    scn2 = replace(scn, job=replace(scn.job, steps=ing_steps, run_id="bench-sim-e2e"))
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(f"{tmp}/server")
        try:
            t1 = time.perf_counter()
            res2 = run_scenario(scn2, server=url, speed=0)
            ing = time.perf_counter() - t1
        finally:
            stop_server(proc)
    ing_records = sum(res2.records.values())
    print(f"ingested {ing_records:,} records in {ing:.2f}s end to end", file=sys.stderr)
    emit(
        {
            "records_per_s": round(records / gen),
            "rank_steps_per_s": round(res.records["step"] / gen),
            "ingested_records_per_s": round(ing_records / ing),
            "records": records,
            "ingested_records": ing_records,
            "world_size": scn.world_size,
            "goal_rank_steps_per_s": 1_000_000,
            "ok": res.records["step"] / gen >= 1_000_000,
        }
    )


if __name__ == "__main__":
    main()
