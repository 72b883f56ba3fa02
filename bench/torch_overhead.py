"""Instrumented over uninstrumented step time of the DDP example (4 gloo ranks, CPU).

Measured alternately in the same run: ``--instrument alternate`` switches fleetlens's step,
phase and logging calls on and off every ``--block`` steps on every rank, so both halves see the
same machine state. The job's step time is the slowest rank's; the key ``overhead_ratio`` is the
median, over adjacent (plain, instrumented) block pairs, of instrumented over plain. (The DDP
comm hook that records collectives stays registered in both halves; ``separate_runs_ratio``
compares a fully instrumented run with one that has fleetlens disabled, hook included, in
back-to-back runs, and is at the mercy of the machine's drift; ``--quick`` runs neither, and
says null.) ``instrumentation_us_per_step`` is the deterministic part: the CPU time of the
per-step calls themselves, measured in process.
Goal: overhead_ratio under 1.01.

Triggered trace capture (``FLEETLENS_TRACE_CAPTURE=1``): a fourth run, its ranks on one core
and a server of its own on another (so the server's import of the traces is not the job's cost),
asks the server at step 20 for a capture of ranks 1 and 0. ``capture_max_step_ratio_outside``
is the job's slowest step outside the capture over the run's median step, goal at most 2; the
capture is its warm-up step, the 3 profiled steps and the step after them, in which the other
ranks wait for the profiled ones writing their trace (``capture_max_step_ratio_profiled`` and
``capture_step_after_ratio`` say what those cost; ``capture_max_step_ratio_before`` is the same
run's slowest step before the capture, the machine's own jitter). ``capture_to_evidence_s`` is
the time from the request to both ranks' traces imported and summed up, goal under 60 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, start_server, stop_server

EXAMPLE = Path(__file__).resolve().parents[1] / "fleetlens" / "examples" / "ddp_train.py"


def run_job(url: str, stats: str, run_id: str, steps: int, mode: str, block: int) -> list[list]:
    env = {
        **os.environ,
        "FLEETLENS_SERVER": url,
        "FLEETLENS_RUN_ID": run_id,
        "OMP_NUM_THREADS": "1",
    }
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "4",
            str(EXAMPLE),
            "--steps",
            str(steps),
            "--instrument",
            mode,
            "--block",
            str(block),
            "--stats-dir",
            stats,
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return rank_steps(stats)


def _pinned_server(data: str) -> tuple[subprocess.Popen[bytes], str]:
    """The server on the machine's last core (it inherits this process's affinity while it
    starts), so that its import of the traces is not charged to the job's steps."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return start_server(data)
    os.sched_setaffinity(0, {cores[-1]})
    try:
        return start_server(data)
    finally:
        os.sched_setaffinity(0, set(cores))


def capture_job(data: str, stats: str, steps: int) -> tuple[dict[int, float], dict, float]:
    """The example with trace capture on (``FLEETLENS_TRACE_CAPTURE=1``), its 4 ranks on the
    machine's first core and a server of its own on the last: at step 20 ask the server for a
    capture of ranks 1 and 0 (3 steps), as a person or a straggler finding does. Returns the
    job's step times (the slowest rank's), the capture, and the seconds from the request to its
    evidence (both ranks' traces imported and summed up)."""
    from fleetlens.client import Client

    proc, url = _pinned_server(data)
    env = {
        **os.environ,
        "FLEETLENS_SERVER": url,
        "FLEETLENS_RUN_ID": "bench-capture",
        "FLEETLENS_TRACE_CAPTURE": "1",
        "OMP_NUM_THREADS": "1",
    }
    cores = sorted(os.sched_getaffinity(0))
    pin = ["taskset", "-c", str(cores[0])] if len(cores) > 1 and shutil.which("taskset") else []
    args = ["--steps", str(steps), "--stats-dir", stats]
    cmd = [*pin, sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "4", str(EXAMPLE), *args]  # fmt: skip
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with Client(url) as c:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and job.poll() is None:
                try:
                    if c.get("/v1/runs/bench-capture").get("lastStep", -1) >= 20:
                        break
                except Exception:
                    pass  # the run is not on the server yet
                time.sleep(0.2)
            asked = time.monotonic()
            cap = c.post("/v1/runs/bench-capture/traces/captures", {"ranks": [1, 0], "steps": 3})
            path = f"/v1/runs/bench-capture/traces/captures/{cap['captureId']}"
            while cap["state"] != "done" and time.monotonic() - asked < 300 and job.poll() is None:
                time.sleep(0.2)
                cap = c.get(path)
            took = time.monotonic() - asked
            _, err = job.communicate(timeout=1800)
            if job.returncode != 0:
                raise RuntimeError(err.decode(errors="replace")[-3000:])
            cap = c.get(path)
    finally:
        if job.poll() is None:
            job.kill()
        stop_server(proc)
    return {s: t for s, (_, t) in job_steps(rank_steps(stats)).items()}, cap, took


CAPTURE_SPAN_S = 20.0
"""Seconds of steps the capture run needs after its step 20: the server's view of the run
lagging the job (~2 s), the capture's lead (``services.captures._LEAD_S``, 10 s: the capture
starts that far ahead at the ranks' pace), its steps and the trace written after them."""


def capture_length(alt: dict[int, tuple[bool, float]]) -> int:
    """Steps of the capture run, from the step time the alternate run measured: on a fast
    machine 200 steps end before a capture 10 s ahead of step 20 starts. The unpinned step time
    is shorter than the pinned run's, so this errs long."""
    step_s = statistics.median(t for _, t in alt.values())
    return max(200, 20 + math.ceil(CAPTURE_SPAN_S / step_s))


def capture_figures(steps: dict[int, float], cap: dict, took: float, warm: int) -> dict:
    """The capture's cost: the slowest step outside it over the run's median step. The capture
    is its warm-up step, its profiled steps, and the step after them: the profiled ranks write
    the trace at the end of the last profiled step, and the other ranks wait for them in that
    next step's first collective. That next step and the profiled ones are reported apart."""
    ev = cap["evidence"]
    if ev["fromStep"] is None:
        raise RuntimeError(f"the capture never arrived: {cap}")
    profiled = set(range(ev["fromStep"] - cap["warmup"], ev["toStep"] + 1))
    after = ev["toStep"] + 1
    rest = {s: t for s, t in steps.items() if s >= warm and s not in profiled and s != after}
    median = statistics.median(rest.values())
    before = [t for s, t in rest.items() if s < min(profiled)]
    out = {
        "capture_max_step_ratio_outside": round(max(rest.values()) / median, 3),
        "capture_max_step_ratio_before": round(max(before) / median, 3) if before else None,
        "capture_max_step_ratio_profiled": round(max(steps[s] for s in profiled) / median, 3),
        "capture_step_after_ratio": round(steps[after] / median, 3) if after in steps else None,
        "capture_to_evidence_s": round(took, 2),
        "capture_steps": [min(profiled), max(profiled)],
    }
    print(
        f"capture: steps {sorted(profiled)} profiled (up to "
        f"{out['capture_max_step_ratio_profiled']}x the median), the trace written at their "
        f"end (step {after}: {out['capture_step_after_ratio']}x); slowest other step "
        f"{out['capture_max_step_ratio_outside']}x ({out['capture_max_step_ratio_before']}x "
        f"before the capture); evidence {took:.1f} s after the request",
        file=sys.stderr,
    )
    return out


def rank_steps(stats: str) -> list[list]:
    """Each rank's (step, instrumented, seconds) rows from the example's --stats-dir."""
    return [json.loads(Path(stats, f"rank{r}.json").read_text())["step_times"] for r in range(4)]


def job_steps(per_rank: list[list]) -> dict[int, tuple[bool, float]]:
    """Per step: whether it was instrumented, and the slowest rank's time."""
    out: dict[int, tuple[bool, float]] = {}
    for times in per_rank:
        for step, on, seconds in times:
            prev = out.get(step, (on, 0.0))[1]
            out[step] = (on, max(prev, seconds))
    return out


def per_step_cost_us(n: int = 20_000) -> float:
    """CPU time of TorchRun's per-step calls (step, 3 phases, loader, log), collector down."""
    import time

    import torch

    import fleetlens
    import fleetlens.torch as fltorch

    with tempfile.TemporaryDirectory() as spool:
        run = fleetlens.init(
            run_id="cost",
            server="http://127.0.0.1:9",
            spool_dir=spool,
            install_signal_handler=False,
        )
        tr = fltorch.TorchRun(run)
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        loss = torch.tensor(1.0)
        costs = []
        for i, _ in enumerate(tr.loader(range(n))):
            t0 = time.perf_counter_ns()
            with tr.step(i, tokens=512):
                with tr.phase("forward"):
                    pass
                with tr.phase("backward"):
                    pass
                with tr.phase("optimizer"):
                    pass
            tr.log(i, loss=loss, optimizer=opt)
            costs.append(time.perf_counter_ns() - t0)
        run.finish()
    return statistics.median(costs) / 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--block", type=int, default=1, help="steps per on/off block")
    ap.add_argument(
        "--capture-steps",
        type=int,
        default=0,
        help="steps of the trace-capture run (default: enough for the capture at this "
        "machine's step time, at least 200)",
    )
    args = ap.parse_args()
    steps = 60 if args.quick else args.steps
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(f"{tmp}/data")
        try:
            os.makedirs(f"{tmp}/alt")
            alt = job_steps(run_job(url, f"{tmp}/alt", "bench-alt", steps, "alternate", args.block))
            full: dict[str, dict[int, tuple[bool, float]]] = {}
            for mode in () if args.quick else ("on", "off"):  # quick: the alternate run's alone
                os.makedirs(f"{tmp}/{mode}")
                job = run_job(url, f"{tmp}/{mode}", f"bench-{mode}", steps // 2, mode, args.block)
                full[mode] = job_steps(job)
        finally:
            stop_server(proc)
        os.makedirs(f"{tmp}/capture")
        cap_steps, capture, capture_s = capture_job(
            f"{tmp}/capture-data", f"{tmp}/capture", args.capture_steps or capture_length(alt)
        )
    warm = max(10, 2 * args.block)  # the first steps warm caches and the allocator
    on = [t for s, (flag, t) in alt.items() if flag and s >= warm]
    off = [t for s, (flag, t) in alt.items() if not flag and s >= warm]
    # Each instrumented block against the plain block just before it: slow drifts of the
    # machine (other processes, the server's merges) cancel within a pair.
    pairs = []
    for s0 in range(warm, steps - 2 * args.block + 1, 2 * args.block):
        a = [alt[s][1] for s in range(s0, s0 + 2 * args.block) if s in alt and not alt[s][0]]
        b = [alt[s][1] for s in range(s0, s0 + 2 * args.block) if s in alt and alt[s][0]]
        if a and b:
            pairs.append(statistics.median(b) / statistics.median(a))
    ratio = statistics.median(pairs)
    sep = (
        statistics.median(t for s, (_, t) in full["on"].items() if s >= warm)
        / statistics.median(t for s, (_, t) in full["off"].items() if s >= warm)
        if full
        else None
    )
    captured = capture_figures(cap_steps, capture, capture_s, warm)
    print(
        f"median step: instrumented {statistics.median(on) * 1000:.2f} ms, plain "
        f"{statistics.median(off) * 1000:.2f} ms ({len(on)} / {len(off)} steps)",
        file=sys.stderr,
    )
    emit(
        {
            "overhead_ratio": round(ratio, 4),
            "pairs": len(pairs),
            "ratio_of_medians": round(statistics.median(on) / statistics.median(off), 4),
            "median_step_ms_instrumented": round(statistics.median(on) * 1000, 3),
            "median_step_ms_plain": round(statistics.median(off) * 1000, 3),
            "steps_compared": [len(on), len(off)],
            "separate_runs_ratio": None if sep is None else round(sep, 4),
            "instrumentation_us_per_step": round(
                per_step_cost_us(2000 if args.quick else 20000), 2
            ),
            **captured,
            "goal": 1.01,
            "capture_goals": {"max_step_ratio_outside": 2.0, "capture_to_evidence_s": 60.0},
            "ok": ratio < 1.01
            and captured["capture_max_step_ratio_outside"] <= 2.0
            and capture_s < 60.0,
        }
    )


if __name__ == "__main__":
    main()
