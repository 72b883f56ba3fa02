"""What a server costs while its runs are quiet: the monitoring pass's CPU with nothing arriving.

A `fleetlens serve` holding finished or paused runs still runs a monitoring pass every
``analysis_interval_s`` (5 s): it judges each active run's status, hangs and alert rules. This
starts one (``fleetlens.testing.Server``, the real process), gives it a number of runs of 50
steps of 8 ranks (``fleetlens.testing.step_batch``, the SDK's batch shape), waits for two passes
over them, then measures its CPU (user + system, from ``/proc``) over ``--seconds`` with nothing
arriving. Figures: CPU seconds a minute at each level (and with no run, in the full mode), and
what one more quiet run adds (between the fewest and the most runs measured).

``--quick``: 3 and 20 runs, 10 s each (the full run: 3, 20 and 100 runs, 30 s each).
Goal: one more quiet run adds under 0.2 CPU seconds a minute (under 17 ms a 5 s pass).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, proc_cpu_s  # noqa: E402

from fleetlens.testing import Server, step_batch, wait_passes  # noqa: E402

GOAL_S_PER_RUN_MINUTE = 0.2


def idle_cpu(runs: int, seconds: float) -> float:
    """CPU seconds a minute of a server holding ``runs`` quiet runs."""
    with tempfile.TemporaryDirectory() as d:
        server = Server(str(Path(d) / "data")).start()
        try:
            assert server.proc is not None
            for r in range(runs):
                status = server.post(step_batch(f"quiet-{r}", range(50), 8)[1])[0]
                assert status == 200, status
            wait_passes(server, 2, timeout=120)  # the runs analysed: what follows is quiet
            before = proc_cpu_s(server.proc.pid)
            time.sleep(seconds)
            return (proc_cpu_s(server.proc.pid) - before) * 60.0 / seconds
        finally:
            server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float, default=None)
    args = ap.parse_args()
    seconds = args.seconds or (10.0 if args.quick else 30.0)
    levels = [3, 20] if args.quick else [3, 20, 100]
    out: dict[str, Any] = {"bench": "idle_server", "quick": args.quick, "seconds": seconds}
    out["cpu_s_per_minute_no_run"] = None if args.quick else round(idle_cpu(0, seconds), 2)
    cpu = {n: idle_cpu(n, seconds) for n in levels}
    for n, c in cpu.items():
        out[f"cpu_s_per_minute_{n}_runs"] = round(c, 2)
    lo, hi = levels[0], levels[-1]
    per_run = max(0.0, cpu[hi] - cpu[lo]) / (hi - lo)
    out["cpu_s_per_run_minute"] = round(per_run, 3)
    out["goal_cpu_s_per_run_minute"] = GOAL_S_PER_RUN_MINUTE
    out["ok"] = per_run < GOAL_S_PER_RUN_MINUTE
    emit(out)


if __name__ == "__main__":
    main()
