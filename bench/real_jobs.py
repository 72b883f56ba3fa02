"""Real training code under torchrun with faults done from outside: does the server get them
right? (issue 32; the harness is bench/_realjobs.py, the codes tests/realcode.)

For each code (nanoGPT-style ``train.py``, HF ``Trainer``, Lightning) and each fault on rank 2
(none; slow: held from a step on to 70% of the CPU it was using, by a cgroup CPU cap where the
kernel has one, else a SIGSTOP duty cycle; hang: stopped ``--hang-s`` seconds; crash: SIGKILL),
``--cases`` jobs of 4 gloo ranks, each against a fresh server. Figures:

- ``slow_found``: a ``straggler.persistent`` finding naming rank 2 whose start is within 20
  steps of the onset (the step the server showed when the fault began);
- ``crash_reported``: the run FAILED with rank 2 named in its end;
- ``hang_charged``: the run's goodput has a ``hang`` line within 15% of the stop;
- ``false_findings_healthy``: findings on the healthy jobs, all of them counted;
- ``status_right`` of ``status_cases``: the final status as the truth (healthy, slow and hang
  FINISHED, the hang's rank having resumed; crash FAILED);
- ``runs_per_job``: distinct runs on the server for one job, per launch style (``--rdzv-id``,
  nanoGPT's ``--master-port`` only, and the HF Trainer under ``accelerate launch``; 0 there
  when not all 4 ranks reported), the most seen;
- ``overhead_pct``: nanoGPT's tokens/s without the instrumentation (FLEETLENS_DISABLED=1) over
  with it, minus 1, 2 ranks, runs alternated ``--overhead-pairs`` times, median of the pairs.

``--quick``: nanoGPT only, the crash alone, one case, one overhead pair of 60 steps; the
healthy jobs and the master-port and accelerate launches are left to tests/test_real_jobs.py,
which runs them (``runs_per_job`` then has the rendezvous launch alone).
A figure short of its goal makes ``ok`` false; the script still exits 0.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit  # noqa: E402

from bench._realjobs import CODES, Fault, JobResult, fresh_server, run_job  # noqa: E402

TRUTH = {"none": "FINISHED", "slow": "FINISHED", "hang": "FINISHED", "crash": "FAILED"}
_ITER = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms", re.M)


def slow_found(r: JobResult) -> bool:
    if r.onset_step is None:
        return False
    for f in r.findings:
        start = f.get("startStep", f.get("step"))
        if (
            f.get("diagnosis") == "straggler.persistent"
            and r.fault.rank in f.get("ranks", [])
            and start is not None
            and abs(int(start) - r.onset_step) <= 20
        ):
            return True
    return False


def crash_reported(r: JobResult) -> bool:
    ended = r.run.get("ended") or {}
    return r.status == "FAILED" and r.fault.rank in ended.get("ranks", [])


def hang_seconds(r: JobResult) -> float:
    lines = (r.goodput.get("breakdown") or {}).get("lines", [])
    return sum(float(x.get("seconds", 0.0)) for x in lines if x.get("category") == "hang")


def hang_charged(r: JobResult) -> bool:
    return abs(hang_seconds(r) - r.fault.stop_s) <= 0.15 * r.fault.stop_s


def tokens_per_s(r: JobResult, warm: int = 10) -> float:
    """nanoGPT's own log: median step time of the iterations after ``warm`` (rank 0's)."""
    times = [float(ms) for it, ms in _ITER.findall(r.output) if int(it) >= warm]
    if not times:
        raise RuntimeError(f"no iteration times in the job's output:\n{r.output[-2000:]}")
    tokens = 4 * 16 * 64  # config/tiny.py: gradient_accumulation_steps x batch_size x block_size
    return tokens / (statistics.median(times) / 1000.0)


def overhead_pct(pairs: int, steps: int) -> tuple[float, list[float]]:
    with tempfile.TemporaryDirectory() as tmp, fresh_server() as srv:
        data = f"{tmp}/work"
        Path(data).mkdir()
        out: list[float] = []
        for _ in range(pairs):
            rates = {}
            for mode in ("off", "on"):
                env = {"FLEETLENS_DISABLED": "1"} if mode == "off" else {}
                r = run_job(
                    srv, "nanogpt", steps=steps, nproc=2, workdir=data, env=env, judge=False
                )
                if r.returncode != 0:
                    raise RuntimeError(f"overhead job ({mode}) failed:\n{r.output[-2000:]}")
                rates[mode] = tokens_per_s(r)
            out.append((rates["off"] / rates["on"] - 1.0) * 100.0)
    return statistics.median(out), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cases", type=int, default=3, help="jobs per code and fault")
    ap.add_argument("--codes", default=",".join(CODES))
    ap.add_argument("--faults", default="none,slow,hang,crash")
    ap.add_argument("--hang-s", type=float, default=150.0)
    ap.add_argument("--overhead-pairs", type=int, default=3)
    args = ap.parse_args()
    codes = ["nanogpt"] if args.quick else args.codes.split(",")
    faults = ["crash"] if args.quick else args.faults.split(",")
    cases = 1 if args.quick else args.cases
    pairs = 1 if args.quick else args.overhead_pairs
    plan = {  # steps, and the fault's step
        "none": (100, 0),
        "slow": (220, 40),
        "hang": (80, 30),
        "crash": (400, 20),
    }
    t0 = time.monotonic()
    results: list[JobResult] = []
    for code in codes:
        for kind in faults:
            steps, at = plan[kind]
            for case in range(cases):
                fault = Fault(kind, at_step=at, stop_s=args.hang_s)
                with fresh_server() as srv:
                    r = run_job(srv, code, steps=steps, fault=fault, settle_s=120)
                results.append(r)
                seen = [(f.get("diagnosis"), f.get("ranks"), f.get("startStep"))
                        for f in r.findings]  # fmt: skip
                print(
                    f"{code} {kind} #{case}: rc {r.returncode} runs {len(r.run_ids)} status "
                    f"{r.status} onset {r.onset_step} findings {seen} "
                    f"hang {hang_seconds(r):.1f}s {r.fault_how} "
                    f"({r.timings.get('total_s', 0):.0f} s)",
                    file=sys.stderr,
                )
    runs_per_job = {"rdzv": max(len(r.run_ids) for r in results)}
    if not args.quick:
        with fresh_server() as srv:
            mp = run_job(srv, "nanogpt", steps=20, launch="master-port", settle_s=60)
        print(f"master-port: runs {mp.run_ids}", file=sys.stderr)
        with fresh_server() as srv:  # Accelerate's launcher, as HF users start a Trainer
            acc = run_job(srv, "hf", steps=20, launch="accelerate", settle_s=60)
        print(f"accelerate: runs {acc.run_ids} ranks {acc.reporting_ranks}", file=sys.stderr)
        runs_per_job["master-port"] = len(mp.run_ids)
        runs_per_job["accelerate"] = len(acc.run_ids) if acc.reporting_ranks == [0, 1, 2, 3] else 0
    over, over_all = overhead_pct(pairs, 60 if args.quick else 300)

    def of(kind: str) -> list[JobResult]:
        return [r for r in results if r.fault.kind == kind]

    def ratio(kind: str, judge: Any) -> str | None:
        jobs = of(kind)
        return f"{sum(map(judge, jobs))}/{len(jobs)}" if jobs else None

    status_right = sum(r.status == TRUTH[r.fault.kind] for r in results)
    false_healthy = sum(len(r.findings) for r in of("none"))

    def full(score: str | None) -> bool:
        return score is None or score.split("/")[0] == score.split("/")[1]

    result = {
        "bench": "real_jobs",
        "quick": args.quick,
        "codes": codes,
        "cases_per_fault": cases,
        "slow_found": ratio("slow", slow_found),
        "crash_reported": ratio("crash", crash_reported),
        "hang_charged": ratio("hang", hang_charged),
        "hang_s": args.hang_s,
        "false_findings_healthy": false_healthy,
        "status_right": status_right,
        "status_cases": len(results),
        "runs_per_job": runs_per_job,
        "slow_how": sorted({r.fault_how.split()[0] for r in of("slow") if r.fault_how}),
        "overhead_pct": round(over, 2),
        "overhead_pct_pairs": [round(x, 2) for x in over_all],
        "seconds": round(time.monotonic() - t0, 1),
        "goal": "all found, 0 false findings, statuses right, 1 run per job, overhead < 1%",
    }
    result["ok"] = (
        all(full(result[k]) for k in ("slow_found", "crash_reported", "hang_charged"))
        and false_healthy == 0
        and status_right == len(results)
        and set(runs_per_job.values()) == {1}
        and over < 1.0
    )
    emit(result)


if __name__ == "__main__":
    main()
