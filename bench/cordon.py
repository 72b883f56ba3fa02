"""Auto-cordon: time from the drain decision to the first step at the smaller world size.

The cordon drill (fleetlens.remediation.drill): three torchrun agents on this host train the
DDP example; a fatal Xid is reported for one node by its node agent; the server (remediation
``automatic``, analysis pass every second) drains the node, the job stops at an agreed step
boundary, checkpoints (verified), the node's agent is stopped, the other two re-rendezvous at
world size 2 and resume. Keys: ``recovery_s`` (median over trials: decision -> the first step at
world size 2 has finished), ``steps_lost`` (most over trials: steps run before the drain and not
kept), per-phase medians, ``fault_to_decision_s`` (the Xid sample sent -> the decision).
Goals: under 15 s and 0 on this machine.

The fatal fault for real (``Drill.lose_gpu``): node-c's GPU falls off the bus, its workers are
killed (SIGKILL) and Xid 79 is reported; the others' collective fails, torchrun restarts the job,
the server takes node-c out, and the job resumes from its newest verified checkpoint (one every
``FATAL_CHECKPOINT_EVERY`` steps) at world size 2. Keys: ``fatal_recovery_s`` (median: the
workers killed -> the first step at world size 2 has finished; the failure's detection by the
survivors and torchrun is inside it), ``fatal_steps_lost`` (most: steps run since that
checkpoint, run again), ``fatal_kill_to_decision_s``. Goal: steps lost at most the interval.

No in-process baseline exists for a recovery; for scale, the seed puts manual recovery at about
three hours and automated at about five minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, start_server, stop_server

from fleetlens.remediation.drill import Drill

GOAL_S = 15.0
FATAL_CHECKPOINT_EVERY = 25


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def _server(root: Path, k: int) -> tuple[Any, str]:
    return start_server(
        str(root / f"server-{k}"),
        {
            "FLEETLENS_REMEDIATION": "automatic",
            "FLEETLENS_ANALYSIS_INTERVAL_S": "1",
            # The Xid is the fault measured; a rank starved of CPU on this machine is not.
            "FLEETLENS_STRAGGLER_PERSIST_S": "3600",
            "FLEETLENS_READABLE_PATHS": str(root),  # the job's checkpoints: a shared file system
        },
    )


def _run_to(url: str, run: str, step: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            if (_get(f"{url}/v1/runs/{run}")["step"] or 0) >= step:  # None: no step yet
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the drill's job did not reach step {step}")


def _outcome(url: str, run: str, deadline: float) -> dict[str, Any]:
    while time.monotonic() < deadline:
        rows = _get(f"{url}/v1/remediations?runId={run}")["remediations"]
        if rows and rows[0]["state"] in ("resumed", "failed", "drained"):
            a: dict[str, Any] = rows[0]
            if a["state"] != "resumed":
                raise RuntimeError(f"the action ended {a['state']}: {a['error']}")
            return a
        time.sleep(0.5)
    raise RuntimeError("no recovery within the time allowed")


def trial(root: Path, k: int) -> dict[str, Any]:
    proc, url = _server(root, k)
    run = f"bench-cordon-{k}"
    drill = Drill(url, root / f"job-{k}", run, example_args=("--checkpoint-every", "100"))
    try:
        drill.start()
        deadline = time.monotonic() + 180
        _run_to(url, run, 40, deadline)
        t_fault = time.time()
        drill.inject_xid("node-c", 79)
        a = _outcome(url, run, deadline + 120)
        a["faultToDecisionS"] = a["decidedAt"] - t_fault
        print(
            f"trial {k}: recovery {a['recoveryS']:.2f} s, steps lost {a['stepsLost']}, world "
            f"{a['worldBefore']} -> {a['worldAfter']}, phases "
            + ", ".join(f"{n} {p['seconds']:.2f}" for n, p in a["phases"].items()),
            file=sys.stderr,
        )
        return a
    finally:
        drill.stop()
        stop_server(proc)


def fatal_trial(root: Path, k: int) -> dict[str, Any]:
    """The fatal fault: node-c's workers killed at a step of the run's choosing (wherever they
    are when step 40 is seen), the recovery timed from the kill."""
    proc, url = _server(root, 100 + k)
    run = f"bench-fatal-{k}"
    every = str(FATAL_CHECKPOINT_EVERY)
    drill = Drill(url, root / f"fatal-{k}", run, example_args=("--checkpoint-every", every))
    try:
        drill.start()
        deadline = time.monotonic() + 180
        _run_to(url, run, 40, deadline)
        killed = drill.lose_gpu("node-c", 79)
        a = _outcome(url, run, deadline + 180)
        if not a["checkpoint"].get("lost"):
            raise RuntimeError(f"the action did not see node-c's ranks lost: {a}")
        first = a["decidedAt"] + a["recoveryS"]  # the first step at the new world size ended
        a["fatalRecoveryS"] = first - killed
        a["killToDecisionS"] = a["decidedAt"] - killed
        print(
            f"fatal trial {k}: recovery {a['fatalRecoveryS']:.2f} s from the kill (decision "
            f"after {a['killToDecisionS']:.2f} s), steps lost {a['stepsLost']} (checkpoint "
            f"every {every}), resumed at {a['resumeStep']}, world {a['worldBefore']} -> "
            f"{a['worldAfter']}, phases "
            + ", ".join(f"{n} {p['seconds']:.2f}" for n, p in a["phases"].items()),
            file=sys.stderr,
        )
        return a
    finally:
        drill.stop()
        stop_server(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one trial of each")
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    n = 1 if args.quick else args.trials
    with tempfile.TemporaryDirectory() as tmp:
        trials = [trial(Path(tmp), k) for k in range(n)]
        fatal = [fatal_trial(Path(tmp), k) for k in range(n)]
    rec = [float(t["recoveryS"]) for t in trials]
    lost = max(int(t["stepsLost"]) for t in trials)
    phases: dict[str, float] = {}
    for name in trials[0]["phases"]:
        vals = [t["phases"][name]["seconds"] for t in trials if name in t["phases"]]
        phases[name] = round(statistics.median(vals), 3)
    recovery = statistics.median(rec)
    fatal_rec = [float(t["fatalRecoveryS"]) for t in fatal]
    fatal_lost = max(int(t["stepsLost"]) for t in fatal)
    fatal_phases = {
        name: round(statistics.median(t["phases"][name]["seconds"] for t in fatal), 3)
        for name in fatal[0]["phases"]
        if all(name in t["phases"] for t in fatal)
    }
    emit(
        {
            "recovery_s": round(recovery, 2),
            "steps_lost": lost,
            "trials": n,
            "recovery_s_each": [round(r, 2) for r in rec],
            "fault_to_decision_s": round(
                statistics.median(t["faultToDecisionS"] for t in trials), 2
            ),
            "phases_s": phases,
            "world": [trials[0]["worldBefore"], trials[0]["worldAfter"]],
            "goal_recovery_s": GOAL_S,
            "fatal_recovery_s": round(statistics.median(fatal_rec), 2),
            "fatal_steps_lost": fatal_lost,
            "fatal_recovery_s_each": [round(r, 2) for r in fatal_rec],
            "fatal_steps_lost_each": [int(t["stepsLost"]) for t in fatal],
            "fatal_kill_to_decision_s": round(
                statistics.median(t["killToDecisionS"] for t in fatal), 2
            ),
            "fatal_phases_s": fatal_phases,
            "fatal_checkpoint_every": FATAL_CHECKPOINT_EVERY,
            "fatal_world": [fatal[0]["worldBefore"], fatal[0]["worldAfter"]],
            "ok": recovery < GOAL_S and lost == 0 and fatal_lost <= FATAL_CHECKPOINT_EVERY,
        }
    )


if __name__ == "__main__":
    main()
