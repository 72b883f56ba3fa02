"""The hang pass of the analysis loop: an attempt that made no progress for longer than the hang
rule allows (:mod:`fleetlens.analysis.hangs`), and the ranks the others waited for."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..analysis.evidence import Evidence
from ..analysis.hangs import HangRule, behind_ranks, find_stalls, recent_step_time
from ..analysis.rootcause import Diagnosis
from ..config import AnalyzerConfig
from ..lifecycle import ATTEMPT_ENDS, STOPS
from ..store.detect_queries import DetectQueries, JobSpan, Placement, StepMatrix
from ..store.findings import RunToAnalyze

__all__ = ["find_hangs"]


def find_hangs(
    q: DetectQueries,
    run: RunToAnalyze,
    cfg: AnalyzerConfig,
    now: float,
    job: JobSpan,
    m: StepMatrix,
    place: Placement,
    events: list[dict[str, Any]],
    next_start: float | None,
) -> list[Diagnosis]:
    """The stalls of one attempt's progress (steps, checkpoints) that the hang rule calls hangs,
    each with the step it stopped at and the ranks the others wait for: those that never entered
    the step's collective, or, for a hang going on, those whose heartbeats stopped behind."""
    mine = [e for e in events if e["job_id"] == job.job_id]
    first = float(m.start.min()) if len(m.start) else 0.0
    marks = [float(x) for x in np.concatenate((m.start, m.end)) if np.isfinite(x)]
    marks += [
        e["time"]
        for e in mine
        if e["kind"] in ("checkpoint_begin", "checkpoint_end") and e["time"] >= first
    ]
    if not marks:
        return []
    ended = [e["time"] for e in mine if e["kind"] in STOPS]
    beats: dict[int, tuple[float, int, str, float]] = {}
    if next_start is not None:
        end = next_start
    elif any(e["kind"] in ATTEMPT_ENDS for e in mine):
        end = max(e["time"] for e in mine)
    else:
        # The run's own clock (its newest record: steps, events, heartbeats), never the
        # server's: a sender behind its own timestamps, or an imported log, is not a hang.
        beats = q.heartbeats(run.run_id, job.job_id)
        end = min(now, max([run.last_seen, *marks, *(b[0] for b in beats.values())]))
    rule = HangRule(cfg.hang_k, cfg.hang_floor_s)
    thr = rule.threshold(recent_step_time(m.end - m.start))
    found = []
    for st in find_stalls(np.asarray(marks), end, thr, np.asarray(ended)):
        after = m.steps[m.end <= st.since + 1e-6]
        step = int(after.max()) + 1 if len(after) else int(m.steps[0])
        col = q.collectives(run.run_id, job.job_id, step, step)
        entered = set(col["rank"].tolist())
        missing = sorted(set(range(m.world)) - entered) if entered else []
        why = "never entered the collective"
        behind = []
        if st.until >= end and beats:  # hung now: the heartbeats say whom the others wait for
            behind = behind_ranks(beats, end, thr, q.beat_interval(run.run_id, job.job_id))
        if behind:
            missing, why = behind, "stopped behind the others (heartbeats)"
        heard: list[Evidence] = []
        if behind:
            heard.append(
                {
                    "metric": "rank heartbeats (time, step, phase, since)",
                    "value": {str(r): list(beats[r]) for r in behind[:64]},
                }
            )
        found.append(
            Diagnosis(
                f"hang:{job.job_id}:{step}",
                "hang",
                "hang",
                0.9 if missing else 0.7,
                f"no progress for {st.until - st.since:.0f}s (threshold {thr:.0f}s) at step {step}"
                + (f"; ranks {missing[:16]} {why}" if missing else ""),
                step=step,
                start_step=step,
                end_step=-1 if st.until >= end else step,
                time=st.detected_at,
                ranks=missing,
                nodes=sorted(
                    {place.node[r] for r in missing if r < len(place.node) and place.node[r]}
                ),
                job_id=job.job_id,
                evidence=[
                    {
                        "metric": "seconds without progress",
                        "value": st.until - st.since,
                        "threshold": thr,
                        "since": st.since,
                    },
                    {
                        "metric": "ranks missing from the collective",
                        "value": missing[:64],
                        "entered": len(entered),
                        "world": m.world,
                    },
                    *heard,
                ],
            )
        )
    return found
