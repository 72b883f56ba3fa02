"""Ground truth of a simulated run, and scoring of detections against it.

Loss categories (seconds; they sum to the run's wall clock) follow the definitions the goodput
breakdown applies to measured telemetry (docs/goodput.md), evaluated on the simulator's exact
per-rank arrays and its exact bookkeeping of attempts and checkpoints:

- retained steps (kept by a valid checkpoint or by the end of the run) split into
  ``data_stall`` (the longest input wait of any rank in the step), ``straggler`` (the slowest
  rank's compute less the mean rank's: what the others waited for it at the collective,
  healthy noise included) and ``productive`` (the rest);
- ``rework``: steps lost since the last valid checkpoint, and the step in flight when a fault
  or a preemption hit;
- ``startup``: the first attempt's launch; ``checkpoint``: synchronous save pauses, also the
  save a maintenance drain forces;
- ``recovery``: detection, relaunch, reload and warmup after a failure or a hang;
  ``preemption`` and ``maintenance`` (planned drains): the gaps and relaunches they cause;
- ``hang``: from the start of a stuck step until the watchdog fires.

``injected`` holds what the faults *added* to retained steps over the healthy counterfactual
(same noise, no faults): ``straggler`` (slow compute or network) and ``data_stall`` (late
input). ``losses["straggler"] - injected["straggler"]`` is therefore about the healthy spread
of the slowest rank; every other category needs no counterfactual.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["LOSS_CATEGORIES", "GroundTruth", "Score", "TruthFault", "score_detections"]

LOSS_CATEGORIES = (
    "productive",
    "startup",
    "recovery",
    "rework",
    "checkpoint",
    "straggler",
    "data_stall",
    "preemption",
    "maintenance",
    "hang",
)


@dataclass
class TruthFault:
    id: str
    kind: str
    diagnosis: str
    owner: str
    ranks: list[int]
    nodes: list[str]
    gpus: list[str]  # "node:gpu"
    rack: str
    start_step: int
    end_step: int
    start_time: float | None
    end_time: float | None
    job_ids: list[str]
    fatal: bool
    magnitude: float
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class GroundTruth:
    scenario: str
    run_id: str
    seed: int
    world_size: int
    start_time: float
    end_time: float
    steps: int
    job_ids: list[str]
    faults: list[TruthFault]
    losses: dict[str, float]
    records: dict[str, int] = field(default_factory=dict)
    injected: dict[str, float] = field(default_factory=dict)

    @property
    def wall_clock(self) -> float:
        return self.end_time - self.start_time

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["wall_clock"] = self.wall_clock
        return d

    def write(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))
        return p

    @staticmethod
    def read(path: str | Path) -> GroundTruth:
        d = json.loads(Path(path).read_text())
        d.pop("wall_clock", None)
        d["faults"] = [TruthFault(**f) for f in d["faults"]]
        return GroundTruth(**d)


@dataclass(frozen=True)
class Score:
    precision: float
    recall: float
    matched: list[tuple[str, int]]  # (fault id, detection index)
    seconds_to_detect: dict[str, float]
    steps_to_detect: dict[str, int]


def _matches(f: TruthFault, d: dict[str, Any], grace: float) -> bool:
    diag = str(d.get("diagnosis", ""))
    if not (diag == f.diagnosis or f.diagnosis.startswith(diag + ".")):
        return False
    if d.get("ranks") and f.ranks and not set(d["ranks"]) & set(f.ranks):
        return False
    if d.get("nodes") and f.nodes and not set(d["nodes"]) & set(f.nodes):
        return False
    t = d.get("time")
    if t is not None and f.start_time is not None:
        end = (f.end_time if f.end_time is not None else f.start_time) + grace
        if not f.start_time - grace <= float(t) <= end:
            return False
    s = d.get("step")
    return not (s is not None and not f.start_step - 1 <= int(s) <= f.end_step + 1 + grace)


def score_detections(
    truth: GroundTruth, detections: list[dict[str, Any]], grace_s: float = 900.0
) -> Score:
    """Match detections (dicts with ``diagnosis`` and optionally ``ranks``, ``nodes``,
    ``time``, ``step``) to injected faults. A detection matches a fault when the diagnosis is
    equal (or a prefix: "straggler" matches "straggler.persistent"), the location overlaps and
    the time falls inside the fault's window widened by ``grace_s``. Each fault counts once."""
    matched: list[tuple[str, int]] = []
    used: set[int] = set()
    secs: dict[str, float] = {}
    steps: dict[str, int] = {}
    for f in truth.faults:
        for i, d in enumerate(detections):
            if i in used or not _matches(f, d, grace_s):
                continue
            used.add(i)
            matched.append((f.id, i))
            if d.get("time") is not None and f.start_time is not None:
                secs[f.id] = max(0.0, float(d["time"]) - f.start_time)
            if d.get("step") is not None:
                steps[f.id] = max(0, int(d["step"]) - f.start_step)
            break
    # further detections of an already-found fault are not false positives
    extra = {
        i
        for i, d in enumerate(detections)
        if i not in used and any(_matches(f, d, grace_s) for f in truth.faults)
    }
    true_pos = len(used) + len(extra)
    precision = true_pos / len(detections) if detections else 1.0
    recall = len(matched) / len(truth.faults) if truth.faults else 1.0
    return Score(precision, recall, matched, secs, steps)
