"""Randomized Megatron logs with known resumes, for the importer's restart detection
(``bench/detection.py``: ``import_restart_precision`` and ``import_restart_recall``).

Each log: 200-800 iteration lines at log interval 10, a step time of 0.3-3 s with 1-10% noise
per line, 1-4 resumes (one line at 3-20x the step time, apart from each other and from the
start), and 0-2 slow stretches (2-8 lines at 1.6-2.6x) as distractors. The truth is the step each
resume's line begins; a detection is a ``restart`` event the importer inferred from the
iteration time, at that step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fleetlens.importers.megatron import parse_megatron_log

__all__ = ["import_restarts"]

_ARGS = (
    "------------------------ arguments ------------------------\n"
    "  log_interval .................................... 10\n"
    "  global_batch_size ............................... 128\n"
    "  seq_length ...................................... 2048\n"
    "-------------------- end of arguments ---------------------\n"
)


def _log(rng: np.random.Generator) -> tuple[str, set[int]]:
    lines = int(rng.integers(200, 801))
    step_s = float(rng.uniform(0.3, 3.0))
    noise = float(rng.uniform(0.01, 0.10))
    level = np.ones(lines)
    taken = np.zeros(lines, dtype=bool)
    taken[:3] = True
    for _ in range(int(rng.integers(0, 3))):  # slow stretches: a level, not a resume
        n = int(rng.integers(2, 9))
        at = int(rng.integers(5, lines - n - 2))
        if taken[at - 2 : at + n + 2].any():
            continue
        level[at : at + n] = rng.uniform(1.6, 2.6)
        taken[at - 2 : at + n + 2] = True
    resumes: set[int] = set()
    for _ in range(int(rng.integers(1, 5))):
        at = int(rng.integers(5, lines - 2))
        if taken[at - 2 : at + 3].any():
            continue
        level[at] = rng.uniform(3.0, 20.0)
        taken[at - 2 : at + 3] = True
        resumes.add(at * 10 + 1)  # the first iteration the line reports
    times = step_s * level * rng.lognormal(0.0, noise, lines)
    out = [_ARGS]
    for k, t in enumerate(times):
        it = (k + 1) * 10
        out.append(
            f" iteration {it:8d}/{lines * 10:8d} | consumed samples: {it * 128:12d} | "
            f"elapsed time per iteration (ms): {1000 * t:.1f} | learning rate: 1.000E-04 | "
            f"global batch size:   128 | lm loss: {5.0 - k / lines:.6E} | loss scale: 1.0 | "
            "number of skipped iterations:   0 | number of nan iterations:   0 |\n"
        )
    return "".join(out), resumes


def import_restarts(logs: int, seed: int = 36) -> dict[str, Any]:
    """Precision and recall of the resumes the importer infers, over ``logs`` random logs."""
    rng = np.random.default_rng(seed)
    tp = fp = fn = 0
    for _ in range(logs):
        text, truth = _log(rng)
        run = parse_megatron_log(text, "random.log")
        found = {
            e["step"]
            for a in run.attempts
            for e in a.events
            if e["kind"] == "restart" and e["attrs"].get("inferred") == "iteration time"
        }
        tp += len(found & truth)
        fp += len(found - truth)
        fn += len(truth - found)
    return {
        "import_restart_precision": round(tp / max(tp + fp, 1), 4),
        "import_restart_recall": round(tp / max(tp + fn, 1), 4),
        "import_restart_logs": logs,
        "import_restart_resumes": tp + fn,
    }
