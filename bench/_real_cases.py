"""Real-data cases for ``bench/detection.py`` (``real_data_correct`` / ``real_data_cases``).

Each case states what fleetlens should find, why (what the data shows, read from the data,
not from fleetlens), and checks what it found:

- Alibaba PAI v2020 mini-batch times of jobs 2, 3 and 4 (real 10-worker production jobs),
  labelled in ``straggler_labels.json`` beside them by a plain rule stated in that file: one
  case per labelled worker (found as the labelled class, alone, onset within the file's
  tolerance) and one per job (no other worker named). Played through ingest and the analysis
  loop at once (``bench/_delivery.from_matrix``).
- The BigScience Megatron-DeepSpeed logs and the Megatron-LM CI golden values: what their lines
  say (world size in the arguments, how the job ended, the slow iterations, the 'nan' tail
  of the golden values, which is padding and not a NaN loss),
  read by the importer, and each imported run played through ingest and the analysis loop
  without a hang (an imported log is history, never a live job that stopped).

Reads files under ``tests/data`` only; imports nothing of ``tests/``.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from bench._delivery import Player, Way, from_matrix
from fleetlens.importers.megatron import read_megatron
from fleetlens.importers.runlog import ImportedRun, batches
from fleetlens.services.analyzer import analyze_once
from fleetlens.store.scope import Scope

__all__ = ["Case", "real_cases"]

REAL = Path(__file__).resolve().parents[1] / "tests" / "data" / "real"
PAI = REAL / "cluster_traces" / "alibaba_pai_v2020_minibatch_time"
LOGS = REAL / "training_logs"
BIG = LOGS / "bigscience_megatron_deepspeed"
GOLDEN = (
    LOGS / "megatron_lm_ci_golden_values" / "gpt3_15b_8t_release__golden_values_dev_dgx_h100.json"
)


@dataclass
class Case:
    name: str
    expected: str
    why: str
    ok: bool
    got: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "expected": self.expected, "why": self.why, "ok": self.ok,
                "got": self.got}  # fmt: skip


def _pai_job(j: str) -> tuple[np.ndarray, np.ndarray]:
    rows: dict[tuple[int, int], float] = {}
    with open(PAI / f"job_{j}_norm.csv") as fh:
        for r in csv.DictReader(fh):
            rows.setdefault((int(r["time"]), int(r["worker"])), float(r["batch_time_norm"]))
    its = np.array(sorted({t for t, _ in rows}))
    x = np.full((len(its), max(w for _, w in rows) + 1), np.nan)
    for (t, w), v in rows.items():
        x[np.searchsorted(its, t), w] = v
    return its, x


def _pai(player: Player, jobs: tuple[str, ...] | None) -> list[Case]:
    labels = json.loads((PAI / "straggler_labels.json").read_text())
    tol = int(labels["tolerance_iterations"])
    out = []
    for job, labs in sorted(labels["jobs"].items()):
        if jobs is not None and job not in jobs:
            continue
        its, x = _pai_job(job)
        rows = player.play(from_matrix(f"pai-job-{job}", its, x / 1000.0, 1.6e9), Way("bulk"))
        found = [r for r in rows if r["kind"] == "straggler"]
        for lab in labs:
            mine = [r for r in found if lab["worker"] in r["ranks"]]
            ok = (len(mine) == 1 and mine[0]["ranks"] == [lab["worker"]]
                  and mine[0]["diagnosis"] == lab["class"]
                  and abs(mine[0]["start_step"] - lab["onset"]) <= tol)  # fmt: skip
            got = "; ".join(f"{r['diagnosis']} {r['ranks']} from {r['start_step']}" for r in mine)
            out.append(Case(
                f"pai job {job} worker {lab['worker']}",
                f"{lab['class']} of worker {lab['worker']} alone, onset {lab['onset']} +- {tol}",
                "straggler_labels.json: its median ratio to the job median over 10 recorded "
                "iterations is >= 1.05 from there (rule in the file)",
                ok, got or "not found",
            ))  # fmt: skip
        want = {lab["worker"] for lab in labs}
        other = sorted({k for r in found for k in r["ranks"]} - want)
        out.append(Case(
            f"pai job {job} nothing else", f"no straggler but workers {sorted(want)}",
            "the other workers are within 5% of the job median, or faster (labels file)",
            not other, f"also named: {other}" if other else "none",
        ))  # fmt: skip
    return out


def _play_import(player: Player, run: ImportedRun, run_id: str) -> list[dict[str, Any]]:
    player._n += 1
    tenant = f"import{player._n}"
    for _, body in batches(run, run_id):
        player.ing.ingest(body, "application/msgpack", "gzip", tenant)
    player.ing.registry.flush()
    for _ in range(200):
        analyze_once(player.tel, player.store, time.time(), player.cfg)
        if not player.store.runs_with_new_data():
            break
    return [r.__dict__ for r in player.store.rows(Scope(tenant, "viewer"), run_id)]


def _golden_nan_tail() -> tuple[list[int], bool]:
    """The logged steps where the loss is "nan", and whether every other metric (memory too)
    is "nan" at exactly those steps (nothing was recorded there: the run had stopped)."""
    data = json.loads(GOLDEN.read_text())

    def nan_at(metric: str) -> set[int]:
        vals = data[metric]["values"]
        return {int(k) for k, v in vals.items() if not math.isfinite(float(v))}

    loss = nan_at("lm loss")
    others = [m for m in data if m not in ("lm loss", "iteration-time")]
    return sorted(loss), bool(others) and all(loss <= nan_at(m) for m in others)


def _log_cases(player: Player, quick: bool) -> list[Case]:
    out = []

    def case(name: str, expected: str, why: str, check: Callable[[], tuple[bool, str]]) -> None:
        try:
            ok, got = check()
        except Exception as exc:  # a crash is a wrong answer, shown as such
            ok, got = False, f"error: {exc!r}"
        out.append(Case(name, expected, why, ok, got))

    runs = {p.name: read_megatron(p) for p in sorted(BIG.glob("*.out"))}
    golden = read_megatron(GOLDEN)
    for name, run in runs.items():
        s = msgspec.to_builtins(run.summary())  # as `fleetlens import --json` prints it
        want = 32 if "n8" in name else 64
        case(f"{name} world size", f"world size {want}",
             "the arguments block prints world_size (and the launcher --nnodes x --nproc_per_node)",
             lambda s=s, want=want: (s["worldSize"] == want, f"{s['worldSize']}"))  # fmt: skip
        case(f"{name} start-up", "start-up from the launch to the first iteration (> 0 s)",
             "the log's launch ('time to initialize megatron' before its init stamp, or its first "
             "stamp) comes minutes of lines before iteration 1; it was charged 0 s",
             lambda s=s: (s["startupSeconds"] > 0, f"{s['startupSeconds']} s"))  # fmt: skip
        ends = [e for e in s["events"] if e["kind"] == "preemption"]
        if "1809562" in name or "1999618" in name:
            reason = "cancelled" if "1809562" in name else "time_limit"
            case(f"{name} end", f"the job ended ({reason}) at its last iteration",
                 "slurmstepd's CANCELLED line after the last iteration line",
                 lambda run=run, reason=reason, ends=ends: (
                     any(e["kind"] == "preemption" and e["attrs"].get("end") == reason
                         for a in run.attempts for e in a.events), str(ends)))  # fmt: skip
        else:
            case(f"{name} healthy", "one attempt, no restart, no NaN, no slow period",
                 "iterations 1..N once, all within 1.2x of the median, finite losses",
                 lambda s=s: (len(s["attempts"]) == 1 and s["restarts"] == 0
                              and not s["nonFinite"] and not s["slowPeriods"],
                              f"attempts {s['attempts']} restarts {s['restarts']} nonfinite "
                              f"{s['nonFinite']} slow {s['slowPeriods']}"))  # fmt: skip
    gs = msgspec.to_builtins(golden.summary())
    case("golden slow period", "one slow period covering iterations 2,100-2,300",
         "iteration-time is ~6.1 s at steps 2100, 2200, 2300 (recorded every 100) against a "
         "median of 1.435 s",
         lambda: (len(gs["slowPeriods"]) == 1 and gs["slowPeriods"][0]["fromStep"] <= 2100
                  and gs["slowPeriods"][0]["toStep"] >= 2300, str(gs["slowPeriods"])))  # fmt: skip
    nan_steps, padding = _golden_nan_tail()
    if nan_steps and padding:
        case("golden NaN tail", "no NaN loss: the run ends before the 'nan' tail",
             f"lm loss is 'nan' at its last {len(nan_steps)} logged steps (from {nan_steps[0]}), "
             "and so is every other metric, memory included: nothing was recorded there",
             lambda: (not gs["nonFinite"] and not any(e["kind"] == "nan" for e in gs["events"]),
                      f"nonFinite {gs['nonFinite']}, events {[e['kind'] for e in gs['events']]}",
                      ))  # fmt: skip
    else:
        case(
            "golden NaN loss",
            f"a NaN loss from step {nan_steps[0]}",
            "lm loss is 'nan' where other metrics were recorded",
            lambda: (bool(gs["nonFinite"].get("loss")), f"nonFinite {gs['nonFinite']}"),
        )
    case(
        "golden no restart",
        "no restart",
        "the iteration counter never goes back and no iteration takes 10x the median",
        lambda: (gs["restarts"] == 0, f"restarts {gs['restarts']}"),
    )
    played: dict[str, list[dict[str, Any]]] = {}

    def rows_of(name: str, run: ImportedRun) -> list[dict[str, Any]]:
        """The findings of ``run`` played through the loop, played once for its cases."""
        if name not in played:
            played[name] = _play_import(player, run, f"imported-{name.split('.')[0]}")
        return played[name]

    def no_hang(rows: list[dict[str, Any]]) -> tuple[bool, str]:
        return not [r for r in rows if r["kind"] == "hang"], str(
            sorted({r["diagnosis"] for r in rows})
        )

    def no_instability(rows: list[dict[str, Any]]) -> tuple[bool, str]:
        return not [r for r in rows if r["diagnosis"] == "instability"], str(
            [(r["diagnosis"], r["summary"]) for r in rows]
        )

    for name, run in [*runs.items(), *([] if quick else [("golden", golden)])]:
        case(
            f"{name} through the loop: no hang",
            "no hang finding",
            "an imported log is history: nothing is waiting on it",
            lambda name=name, run=run: no_hang(rows_of(name, run)),
        )
        if "1809562" in name:
            case(
                f"{name} through the loop: no instability",
                "no instability finding",
                "iteration 10 logged no loss because the fp16 loss scaler skipped all 10 of its "
                "iterations ('number of nan iterations: 0'); the early grad norms are the "
                "scaler finding its scale (10, 8, 1 iterations skipped), not a divergence",
                lambda name=name, run=run: no_instability(rows_of(name, run)),
            )
    return out


def real_cases(root: Path, quick: bool = False) -> list[Case]:
    """Every case; ``quick``: PAI job 2 only, and the golden values not played through the
    loop (the slow parts)."""
    player = Player(root)
    try:
        return _pai(player, ("2",) if quick else None) + _log_cases(player, quick)
    finally:
        player.close()
