"""Generated pipeline-parallel jobs through ingest and the analysis loop (issue 33).

Each job is a simulator scenario with a random layout (pp 2 or 4, tp 1, 2 or 4, dp 2 or 4), a
random noise (1-4 % per rank), and one of: balanced stages; one stage (the last two times in
three, else another) doing 8-60 % more work; a slow GPU (a persistent straggler, 10-50 %,
from a third of the run); both; or uneven batches (each replica's batch cost varying 5-20 % step
to step, ``Job.batch_cov``; with a heavy stage one time in two). Imbalances of 2 % or less are
drawn as balanced, so nothing falls in the 3-7 % band a 5 % threshold cannot be asked to split.

Scored per job against what was generated:
- ``stage_imbalance_called_infrastructure``: jobs where a rank of the heavy stage that is not
  the slow GPU is named in an infrastructure finding (goal 0).
- ``worker_vs_stage_precision`` / ``_recall``: the verdicts (the heavy stage as
  ``stage_imbalance``, the slow GPU's rank as a straggler, uneven batches as
  ``batch_imbalance``) over the verdicts made and the verdicts due (goal >= 0.95 each).
- ``whatif_abs_err_p95``: the stage finding's ``share`` (the what-if saving over the steps'
  time) against the simulator's (``injected["stage_imbalance"]`` over the same steps), p95 of
  the absolute error over the jobs with a heavy stage and no slow GPU (goal <= 0.03). With a
  slow GPU too, the simulator's what-if is taken without it and the two do not compare.
- ``batch_whatif_abs_err_p95``: the same for the ``batch_imbalance`` finding's share against
  ``injected["batch_imbalance"]``, over the jobs with uneven batches and no heavy stage.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench._delivery import Player, Recorded, Way, record_scenario
from fleetlens.analysis.rootcause import owner_of
from fleetlens.sim.model import Cluster, FaultSpec, Job, Noise, Scenario

__all__ = ["pipeline_jobs", "pipeline_quality"]


def pipeline_jobs(n: int, seed: int) -> list[tuple[Scenario, dict[str, Any]]]:
    """``n`` scenarios and what each was made with (``stage``: the heavy stage or -1,
    ``slow``: the slow GPU's rank or -1)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        pp, tp, dp = int(rng.choice([2, 4])), int(rng.choice([1, 2, 4])), int(rng.choice([2, 4]))
        world = pp * tp * dp
        gpn = 8
        kind = ("balanced", "stage", "worker", "both", "batches")[i % 5]
        work = [1.0] * pp
        stage = -1
        batch_cov = float(rng.uniform(0.05, 0.2)) if kind == "batches" else 0.0
        if kind in ("stage", "both") or (kind == "batches" and rng.random() < 0.5):
            stage = pp - 1 if rng.random() < 2 / 3 else int(rng.integers(0, pp - 1))
            work[stage] = 1.0 + float(rng.uniform(0.08, 0.6))
        else:
            work = [1.0 + float(rng.uniform(0.0, 0.02)) for _ in range(pp)]
        steps = int(rng.integers(300, 500))
        faults: tuple[FaultSpec, ...] = ()
        slow = -1
        if kind in ("worker", "both"):
            slow = int(rng.integers(0, world))
            faults = (
                FaultSpec(
                    "straggler.persistent",
                    step=steps // 3,
                    ranks=(slow,),
                    magnitude=float(rng.uniform(0.1, 0.5)),
                ),
            )
        scn = Scenario(
            name=f"pipeline-{i}",
            cluster=Cluster(nodes=max(1, -(-world // gpn)), gpus_per_node=gpn, spare_nodes=1),
            job=Job(
                run_id=f"pp-{seed}-{i}",
                world_size=world,
                tp=tp,
                pp=pp,
                stage_work=tuple(work),
                batch_cov=batch_cov,
                step_time=float(rng.uniform(0.5, 2.0)),
                steps=steps,
                checkpoint_every=10**6,
            ),
            noise=Noise(rank_cov=float(rng.uniform(0.01, 0.04))),
            faults=faults,
        )
        what = {"stage": stage, "slow": slow, "world": world, "pp": pp, "batches": batch_cov > 0}
        out.append((scn, what))
    return out


def _score(
    rows: list[dict[str, Any]], made: dict[str, Any], truth: dict[str, float]
) -> dict[str, Any]:
    per_stage = made["world"] // made["pp"]
    heavy = set(range(made["stage"] * per_stage, (made["stage"] + 1) * per_stage))
    stages = [r for r in rows if r["diagnosis"] == "stage_imbalance"]
    named = {
        rank
        for r in rows
        if r["kind"] == "straggler" or owner_of(r["diagnosis"]) == "infrastructure"
        for rank in r["ranks"]
    }
    batches = [r for r in rows if r["diagnosis"] == "batch_imbalance"]
    called_infra = bool((named & heavy) - {made["slow"]})
    due = (made["stage"] >= 0) + (made["slow"] >= 0) + made["batches"]
    right = 0
    made_v = len(stages) + len(named) + len(batches)
    right += sum(1 for r in stages if r["evidence"][0]["stage"] == made["stage"])
    right += int(made["slow"] in named)
    right += len(batches) if made["batches"] else 0
    found = int(any(r["evidence"][0]["stage"] == made["stage"] for r in stages))
    found += int(made["slow"] in named)
    found += int(bool(batches) and made["batches"])
    err = batch_err = None
    if stages and made["stage"] >= 0 and made["slow"] < 0 and not made["batches"]:
        err = abs(stages[0]["evidence"][0]["share"] - truth["stage_imbalance"])
    if batches and made["batches"] and made["stage"] < 0:
        batch_err = abs(batches[0]["evidence"][0]["share"] - truth["batch_imbalance"])
    return {"infra": called_infra, "due": due, "made": made_v, "right": right, "found": found,
            "err": err, "batch_err": batch_err}  # fmt: skip


def _truth_share(rec: Recorded) -> dict[str, float]:
    """What the imbalances cost in truth: the simulator's what-if savings (stages balanced,
    batches even) over the steps' time (each step as long as its slowest rank: every rank's
    ``duration``)."""
    assert rec.truth is not None
    wall = 0.0
    for _, cols in rec.steps:
        order = np.argsort(cols["step"], kind="stable")
        steps, dur = cols["step"][order], cols["duration"][order]
        cut = np.flatnonzero(np.diff(steps)) + 1
        wall += float(sum(part.max() for part in np.split(dur, cut)))
    keys = ("stage_imbalance", "batch_imbalance")
    return {k: rec.truth.injected.get(k, 0.0) / wall if wall > 0 else 0.0 for k in keys}


def _without_layout(rec: Recorded) -> Recorded:
    """The same run with its job announcements stripped of the config (as main was before the
    layout: every rank judged against the whole job)."""
    other = []
    for ctx, tables in rec.other:
        if "event" in tables:
            n, cols = tables["event"]
            attrs = [
                json.dumps({k: v for k, v in json.loads(a).items() if k != "config"})
                if kind == "job_start" else a
                for kind, a in zip(cols["kind"], cols["attrs"], strict=True)
            ]  # fmt: skip
            tables = {**tables, "event": (n, {**cols, "attrs": attrs})}
        other.append((ctx, tables))
    return replace(rec, run_id=rec.run_id, other=other)


def pipeline_quality(n: int, seed: int = 33, player: Player | None = None) -> dict[str, Any]:
    """Play ``n`` generated pipeline jobs at once through ingest and the loop (into ``player``,
    or a store of its own); the figures of the module docstring, and
    ``stage_imbalance_called_infrastructure_without_layout``: the same jobs with no layout in
    their config (what main did before)."""
    if player is None:
        with tempfile.TemporaryDirectory() as d:
            own = Player(Path(d))
            try:
                return pipeline_quality(n, seed, own)
            finally:
                own.close()
    infra = infra_before = due = made = right = found = 0
    errs: list[float] = []
    batch_errs: list[float] = []
    jobs = pipeline_jobs(n, seed)
    for scn, what in jobs:
        rec = record_scenario(scn, seed=scn.seed)
        rows = player.play(rec, Way("bulk"))
        s = _score(rows, what, _truth_share(rec))
        if what["stage"] >= 0:
            before = player.play(_without_layout(rec), Way("bulk"))
            infra_before += _score(before, what, _truth_share(rec))["infra"]
        infra += s["infra"]
        due, made, right, found = (due + s["due"], made + s["made"],
                                   right + s["right"], found + s["found"])  # fmt: skip
        if s["err"] is not None:
            errs.append(s["err"])
        if s["batch_err"] is not None:
            batch_errs.append(s["batch_err"])
        print(f"pipeline {scn.job.run_id} {what}: {s}", file=sys.stderr)
    return {
        "pipeline_jobs": n,
        "stage_imbalance_called_infrastructure": infra,
        "stage_imbalance_called_infrastructure_without_layout": infra_before,
        "stage_imbalance_jobs": sum(1 for _, w in jobs if w["stage"] >= 0),
        "worker_vs_stage_precision": right / made if made else 1.0,
        "worker_vs_stage_recall": found / due if due else 1.0,
        "whatif_abs_err_p95": float(np.percentile(errs, 95)) if errs else None,
        "batch_imbalance_jobs": sum(1 for _, w in jobs if w["batches"]),
        "batch_whatif_abs_err_p95": float(np.percentile(batch_errs, 95)) if batch_errs else None,
    }
