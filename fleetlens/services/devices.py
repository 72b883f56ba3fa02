"""The devices of a job attempt's window: Xids and climbing ECC on its GPUs, while and after
it held them (a fault's sample often arrives after the attempt it ended)."""

from __future__ import annotations

from typing import Any

from ..analysis.hangs import RECENT_STEPS
from ..analysis.hardware import gpu_health, gpu_signals
from ..analysis.rootcause import Diagnosis, shared_device, xid_diagnosis
from ..lifecycle import ATTEMPT_ENDS
from ..store.detect_queries import DetectQueries, JobSpan, Placement, StepMatrix

__all__ = ["device_window", "hardware", "late_hardware", "placed_until"]


def placed_until(
    events: list[dict[str, Any]], job: JobSpan, next_start: float | None, lag: float
) -> float | None:
    """Until when the attempt held its nodes: how it ended (finish, failure, preemption) plus
    ``lag`` (``[analyzer] device_lag_s``: how long after it a device sample of the fault that
    ended it may be stamped), at the latest the next attempt's start; None while it runs. Node
    and GPU evidence after that belongs to whatever runs there next, not to this run."""
    ends = [
        float(e["time"]) for e in events if e["job_id"] == job.job_id and e["kind"] in ATTEMPT_ENDS
    ]
    if not ends:
        return next_start
    until = max(ends) + lag
    return until if next_start is None else min(until, next_start)


def device_window(
    now: float, job: JobSpan, events: list[dict[str, Any]], nxt: float | None, lag: float
) -> float | None:
    """Until when the ended attempt held its devices, while a sample of that time may still
    arrive (``lag`` more); None while it runs (its windows see it) or once it ended long ago."""
    until = placed_until(events, job, nxt, lag)
    return None if until is None or now > until + lag else until


def late_hardware(
    q: DetectQueries,
    run_id: str,
    now: float,
    job: JobSpan,
    events: list[dict[str, Any]],
    nxt: float | None,
    lag: float,
) -> tuple[list[Diagnosis], bool]:
    """The fault that ended an attempt is often reported after its last step was analysed (a
    GPU that falls off the bus kills the step in flight; its Xid sample comes seconds later):
    the devices of the attempt's final window are looked at again while that can still arrive,
    until ``lag`` after the attempt stopped holding its nodes. True while that
    lasts (the second of what it returns, with the findings): the loop passes over the run
    again even if nothing else of it arrives (a job that died of the fault sends nothing
    more)."""
    until = device_window(now, job, events, nxt, lag)
    unknown = until is None and placed_until(events, job, nxt, lag) is None
    if until is None and not (unknown and now - job.end <= lag):
        return [], False
    # No end known and no step for a while: it may have died of it (a killed rank reports no
    # failure), or be between two slow steps; either way it still holds its nodes.
    lo = max(job.first_step, job.last_step - RECENT_STEPS)
    m = q.step_matrix(run_id, job.job_id, lo, job.last_step, job.world)
    place = q.placement(run_id, job.job_id, m.world)
    return hardware(q, run_id, job, m, place, last=True, next_start=until), until is not None


_DEVICE_FAULTS = {"xid", "ecc_rising", "ecc_uncorrectable"}  # a finding of the GPU, not the run


def hardware(
    q: DetectQueries,
    run_id: str,
    job: JobSpan,
    m: StepMatrix,
    place: Placement,
    last: bool,
    next_start: float | None,
) -> list[Diagnosis]:
    """XIDs and climbing ECC on any GPU of the job over the window; a GPU other runs were
    placed on at the same time is said to be so (:func:`shared_device`)."""
    found: list[Diagnosis] = []
    if not len(m.steps):
        return found
    t0 = float(m.start.min())
    t1 = float(m.end.max()) + (600.0 if last else 0.0)
    if last and next_start is not None:
        t1 = min(t1, next_start)
    nodes = sorted({n for n in place.node if n})
    rank_of = {(place.node[r], int(place.gpu[r])): r for r in range(len(place.node))}
    health = gpu_health(q.gpu_health_rows(nodes, t0, t1))
    faulty = [k for k, g in health.items() if {s.name for s in gpu_signals(g)} & _DEVICE_FAULTS]
    shared = q.gpu_sharers(run_id, faulty, t0, t1)
    for (node, gpu), g in health.items():
        rank = rank_of.get((node, gpu), -1)
        others = shared.get((node, gpu), [])
        for s in gpu_signals(g):
            if s.name == "xid":
                d = xid_diagnosis(int(s.value), node, gpu, rank, int(m.steps[-1]), None)
                d.job_id = job.job_id
                found.append(shared_device(d, others))
            elif s.name in ("ecc_rising", "ecc_uncorrectable"):
                # dated by the counter's own first rise in the attempt, not by the window
                rise = q.first_rise(node, gpu, "ecc_sbe_total", job.start, t1)
                onset = q.step_at(run_id, job.job_id, rise) if rise else None
                found.append(
                    shared_device(
                        Diagnosis(
                            f"gpu:{node}:{gpu}:ecc",
                            "ecc_xid",
                            "event",
                            0.6,
                            f"correctable ECC errors climbing on {node} GPU {gpu} "
                            f"(+{g.sbe_delta:.0f}): "
                            "a double-bit error (Xid 48) may follow; drain it",
                            step=int(m.steps[-1]),
                            end_step=-1,
                            start_step=int(m.steps[0]) if onset is None else onset,
                            time=float(m.end.max()),
                            ranks=[rank] if rank >= 0 else [],
                            nodes=[node],
                            gpus=[f"{node}:{gpu}"],
                            job_id=job.job_id,
                            evidence=[s.to_dict()],
                        ),
                        others,
                    )
                )
    return found
