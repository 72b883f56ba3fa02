"""Root cause: the decision trees of a slow or failed run, as rules over detections and signals.

Throughput drop (001, section 59): data wait up -> data pipeline; collectives slow -> network
(NVLink errors on some GPUs -> NVLink; retransmits or NIC errors -> network); host CPU up ->
host; a slow rank with its clock down and thermal throttle reasons -> thermal; a rack slower than
the workload's baseline -> rack cooling; the whole job slower with everything healthy ->
inefficient compute. Model failure (section 60): a NaN after a grad-norm spike that followed an
LR change -> training instability; OOM with its step and sequence length -> memory.

Every diagnosis carries its evidence (metric, window, value vs baseline), a confidence and an
owner, using the simulator's vocabulary (``fleetlens.sim.faults.FAULT_KINDS``) so that scoring
against ground truth is direct.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..lifecycle import peer_error
from ..names import action_name
from .evidence import Evidence, window
from .hardware import Signal
from .memory import size_text
from .stragglers import StragglerClass
from .xid import classify_xid

__all__ = [
    "OWNERS",
    "Diagnosis",
    "diagnose_events",
    "diagnose_instability",
    "diagnose_slow_checkpoints",
    "diagnose_straggler",
    "owner_of",
]

OWNERS: dict[str, str] = {
    "straggler.persistent": "infrastructure",
    "straggler.intermittent": "infrastructure",
    "straggler.moving": "data_pipeline",
    "thermal": "infrastructure",
    "rack_cooling": "infrastructure",
    "nvlink": "infrastructure",
    "ecc_xid": "infrastructure",
    "fatal_xid": "infrastructure",
    "xid_recoverable": "infrastructure",
    "network": "network",
    "data_stall": "data_pipeline",
    "host": "host",
    "inefficient_compute": "training_code",
    "instability": "training_code",
    "oom": "training_code",
    "memory_climb": "training_code",
    "software_crash": "training_code",
    "rank_lost": "host",
    "hang": "training_code",
    "preemption": "scheduler",
    "maintenance": "scheduler",
    "slow_checkpoint": "storage",
    "topology": "scheduler",
    "stage_imbalance": "training_config",
    "batch_imbalance": "data_pipeline",
    "program_regression": "infrastructure",
    "startup_regression": "infrastructure",
    "mfu_regression": "infrastructure",
    "token_regression": "infrastructure",
    "scaling_regression": "infrastructure",
    "recovery_regression": "infrastructure",
    "checkpoint_regression": "storage",
    "allocation_regression": "scheduler",
}


def owner_of(diagnosis: str) -> str:
    return OWNERS.get(diagnosis, "unknown")


@dataclass
class Diagnosis:
    """One finding. ``key`` identifies it across passes (the store upserts on it)."""

    key: str
    diagnosis: str
    kind: str  # straggler | slowdown | hang | failure | event
    confidence: float
    summary: str
    step: int  # the step at which it was detected
    start_step: int
    end_step: int  # -1: ongoing
    time: float | None = None  # detection time (UNIX seconds)
    ranks: list[int] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)
    rack: str = ""
    job_id: str = ""
    evidence: list[Evidence] = field(default_factory=list)

    @property
    def owner(self) -> str:
        return owner_of(self.diagnosis)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["owner"] = self.owner
        return d


def diagnose_straggler(
    c: StragglerClass,
    signals: dict[int, list[Signal]],
    place: dict[int, tuple[str, int, str]],
    step_time_s: float,
    time_of_step: dict[int, float] | None = None,
) -> Diagnosis:
    """A classified straggler, unless its GPU's telemetry names a hardware cause (thermal)."""
    ev: list[Evidence] = [
        {
            "metric": "compute / step median",
            "value": 1.0 + c.slowdown,
            "baseline": 1.0,
            "window": window(c.start, c.end),
            "episodes": c.episodes,
            "flagged_steps": c.flagged_steps,
            "wait_per_step_s": c.slowdown * step_time_s,
        }
    ]
    diag, conf = c.diagnosis, 0.8
    sigs = [s for r in c.ranks for s in signals.get(r, [])]
    if c.diagnosis != "straggler.moving" and any(s.name == "thermal" for s in sigs):
        diag, conf = "thermal", 0.9
    ev += [s.to_dict() for s in sigs]
    nodes = sorted({place[r][0] for r in c.ranks if r in place})
    gpus = sorted({f"{place[r][0]}:{place[r][1]}" for r in c.ranks if r in place})
    racks = {place[r][2] for r in c.ranks if r in place}
    where = ", ".join(
        f"rank {r} ({place[r][0]} GPU {place[r][1]}, {place[r][2] or '-'})"
        for r in c.ranks[:5]
        if r in place
    )
    summary = {
        "straggler.persistent": f"persistent straggler: {where} {c.slowdown:.1%} slower",
        "straggler.intermittent": f"intermittent straggler in {c.episodes} episodes: {where}",
        "straggler.moving": f"moving straggler over {len(c.ranks)} ranks (systematic: data skew?)",
        "thermal": f"thermal throttling slows {where} by {c.slowdown:.1%}",
    }[diag]
    key_rank = "moving" if diag == "straggler.moving" else str(c.ranks[0])
    return Diagnosis(
        key=f"straggler:{key_rank}",
        diagnosis=diag,
        kind="straggler",
        confidence=conf,
        summary=summary,
        step=c.detected,
        start_step=c.start,
        end_step=c.end,
        time=(time_of_step or {}).get(c.detected),
        ranks=list(c.ranks),
        nodes=nodes,
        gpus=gpus,
        rack=racks.pop() if len(racks) == 1 else "",
        evidence=ev,
    )


def diagnose_events(events: list[dict[str, Any]]) -> list[Diagnosis]:
    """Rules over a job's events: XIDs, OOM, NaN, preemption, maintenance, host and NIC faults,
    exceptions. ``events`` are rows with time, kind, step, rank, node_id, gpu, message, attrs."""
    out: list[Diagnosis] = []
    for e in events:
        kind, attrs = e["kind"], e.get("attrs") or {}
        step, rank, node, gpu = int(e["step"]), int(e["rank"]), e["node_id"], int(e["gpu"])
        t = float(e["time"])
        base: dict[str, Any] = {"step": step, "start_step": step, "end_step": step, "time": t}
        ranks = [rank] if rank >= 0 else []
        nodes = [node] if node else []
        gpus = [f"{node}:{gpu}"] if node and gpu >= 0 else []
        ev: Evidence = {"metric": f"event:{kind}", "value": e.get("message", ""), "time": e["time"]}
        if kind == "hardware_fault" and "xid" in attrs:
            out.append(xid_diagnosis(int(attrs["xid"]), node, gpu, rank, step, float(e["time"])))
        elif kind == "hardware_fault" and attrs.get("component") == "host":
            out.append(
                Diagnosis(
                    f"host:{node}",
                    "host",
                    "failure",
                    0.9,
                    f"host {node} failed",
                    ranks=ranks,
                    nodes=nodes,
                    evidence=[ev],
                    **base,
                )
            )
        elif kind == "hardware_fault" and attrs.get("component") == "nic":
            out.append(
                Diagnosis(
                    f"nic:{node}",
                    "network",
                    "failure",
                    0.9,
                    f"NIC down on {node}",
                    ranks=ranks,
                    nodes=nodes,
                    evidence=[ev],
                    **base,
                )
            )
        elif kind == "oom":
            out.append(_oom(attrs, rank, ev, ranks=ranks, nodes=nodes, gpus=gpus, **base))
        elif kind == "preemption":
            out.append(
                Diagnosis(
                    f"preemption:{step}",
                    "preemption",
                    "event",
                    0.95,
                    _PREEMPTED.get(str(attrs.get("end", "")), "the scheduler preempted the job"),
                    evidence=[ev],
                    **base,
                )
            )
        elif kind == "maintenance":
            out.append(
                Diagnosis(
                    f"maintenance:{node}:{step}",
                    "maintenance",
                    "event",
                    0.95,
                    f"planned maintenance on {node or 'the job'}",
                    nodes=nodes,
                    evidence=[ev],
                    **base,
                )
            )
        elif kind == "exception" and not peer_error(str(e.get("message", ""))):
            # A peer's error ("Connection closed by peer") is the consequence of another
            # rank's end (fleetlens.analysis.ends), not this rank's crash.
            out.append(
                Diagnosis(
                    f"crash:{step}:{rank}",
                    "software_crash",
                    "failure",
                    0.7,
                    f"exception in the training loop on rank {rank}",
                    ranks=ranks,
                    nodes=nodes,
                    evidence=[ev],
                    **base,
                )
            )
    return out


def _oom(attrs: dict[str, Any], rank: int, ev: Evidence, **where: Any) -> Diagnosis:
    """An out-of-memory event (the SDK's, from the real exception): the step, what was asked
    for on which device, the batch shape when the run's config gave it, the device's memory."""
    seq, batch, asked = attrs.get("seq_len"), attrs.get("batch_size"), attrs.get("requested_bytes")
    device, step = attrs.get("device"), where["step"]
    ev.update(
        {
            "seq_len": seq,
            "batch_size": batch,
            "requested_bytes": asked,
            "device": device,
            "step": step,
            "rank": rank,
        }
    )
    for k in ("memory_stats", "device_free_bytes", "device_total_bytes"):
        if k in attrs:
            ev[k] = attrs[k]
    shape = ", ".join(
        p for p in (f"batch {batch}" if batch else "", f"sequence length {seq}" if seq else "") if p
    )
    detail = " ".join(
        p
        for p in (
            f"asking {size_text(float(asked))}" if asked else "",
            f"on {device}" if device else "",
        )
        if p
    )
    summary = f"out of memory at step {step} on rank {rank}" + (f" {detail}" if detail else "")
    return Diagnosis(
        f"oom:{step}:{rank}",
        "oom",
        "failure",
        0.95,
        summary + (f" ({shape})" if shape else ""),
        evidence=[ev],
        **where,
    )


def xid_diagnosis(
    xid: int, node: str, gpu: int, rank: int, step: int, time: float | None
) -> Diagnosis:
    """An XID, classified by NVIDIA's catalog: fatal ECC -> ecc_xid, other fatal -> fatal_xid,
    application -> software_crash (the GPU is fine), recoverable -> a ticket."""
    info = classify_xid(xid)
    if info.fatal:
        diag = "ecc_xid" if info.ecc else "fatal_xid"
    elif info.severity == "application":
        diag = "software_crash"
    else:
        diag = "xid_recoverable"
    key = f"gpu:{node}:{gpu}:ecc" if diag == "ecc_xid" else f"xid:{node}:{gpu}:{xid}"
    return Diagnosis(
        key,
        diag,
        "failure" if info.fatal else "event",
        0.95 if info.fatal else 0.7,
        f"Xid {xid} ({info.mnemonic or 'unknown'}, {info.severity}) on {node} GPU {gpu}; "
        f"catalog action: {action_name(info.action)}",
        step=step,
        start_step=step,
        end_step=step,
        time=time,
        ranks=[rank] if rank >= 0 else [],
        nodes=[node] if node else [],
        gpus=[f"{node}:{gpu}"] if node else [],
        evidence=[
            {
                "metric": "DCGM_FI_DEV_XID_ERRORS",
                "value": xid,
                "severity": info.severity,
                "mnemonic": info.mnemonic,
                "action": info.action,
                "source": "NVIDIA Xid catalog + NVSentinel mapping",
            }
        ],
    )


_PREEMPTED = {
    "time_limit": "the scheduler stopped the job at its time limit",
    "cancelled": "the job was cancelled through the scheduler (scancel)",
}
"""What a scheduler's end of the job (an importer's ``attrs.end``) says, where it says more
than a preemption."""


def shared_device(d: Diagnosis, others: list[str]) -> Diagnosis:
    """A device fault on a GPU that other runs were placed on at the same time: it is not
    known to be this run's, and the finding says so (half the confidence, the runs named)."""
    if not others:
        return d
    d.confidence = round(d.confidence * 0.5, 3)
    d.summary += (
        f"; the GPU was also placed to run {', '.join(others)} at the time: which run it "
        "served is not known (reused node names, or a placement reported wrong)"
    )
    d.evidence.append(
        {
            "metric": "placement",
            "value": len(others) + 1,
            "runs": others,
            "source": "two or more runs placed on one GPU at once",
        }
    )
    return d


def _first_spike(
    gn: Any, ok: Any, factor: float, history: int, min_history: int, block: int = 4096
) -> list[tuple[int, float]]:
    """The first judged grad norm over ``factor`` x the median of the (up to) ``history``
    judged ones before it, at least ``min_history`` of them: ``[(index, that median)]``, or
    none. The medians of the full windows ``block`` rows at a time, each one vectorized median
    (a spike early in a long run reads no more than its block)."""
    idx = np.flatnonzero(ok)
    g = gn[idx]
    if min_history > history:
        return []  # never that many in a window
    for j in range(max(min_history, 1), min(history, len(g))):  # the windows still filling
        ref = float(np.median(g[:j]))
        if ref > 0 and g[j] > factor * ref:
            return [(int(idx[j]), ref)]
    if len(g) <= history:
        return []
    windows = np.lib.stride_tricks.sliding_window_view(g, history)  # windows[k] is before k+h
    for lo in range(0, len(g) - history, block):
        hi = min(lo + block, len(g) - history)
        refs = np.median(windows[lo:hi], axis=1)
        (hit,) = np.nonzero((refs > 0) & (g[lo + history : hi + history] > factor * refs))
        if len(hit):
            k = int(hit[0])
            return [(int(idx[lo + k + history]), float(refs[k]))]
    return []


def diagnose_instability(
    steps: Any,
    loss: Any,
    grad_norm: Any,
    lr: Any,
    spike_factor: float = 5.0,
    *,
    loss_logged: Any = None,
    skipped: Any = None,
    history: int = 20,
    min_history: int = 5,
) -> Diagnosis | None:
    """A NaN/Inf loss, or a grad-norm spike; with the LR change that preceded it as evidence.

    What the log says comes first: a loss that was not logged at a step (``loss_logged``
    False: Megatron logs none for an interval whose iterations the fp16 loss scaler all
    skipped) is not a NaN loss, and a step whose iterations the loss scaler skipped
    (``skipped`` > 0) is not evidence of a spike: it is the scaler finding its scale. A spike is
    judged against the ``history`` finite grad norms before it (at least ``min_history``), never
    against later ones, and the chain is told in the order of its steps: a cause never follows
    its effect."""
    s = np.asarray(steps, dtype=np.int64)
    if not len(s):
        return None
    loss_a, gn, lr_a = (np.asarray(v, dtype=np.float64) for v in (loss, grad_norm, lr))
    logged = np.ones(len(s), bool) if loss_logged is None else np.asarray(loss_logged, bool)
    skip = np.zeros(len(s)) if skipped is None else np.nan_to_num(np.asarray(skipped, float))
    bad = np.flatnonzero(logged & ~np.isfinite(loss_a))
    ok = np.isfinite(gn) & (skip <= 0)
    spikes = _first_spike(gn, ok, spike_factor, history, min_history)
    if not len(bad) and not spikes:
        return None
    # (step, metric, value, baseline) of each link of the chain, in the order of its steps
    chain: list[tuple[int, str, float | str, float | None]] = []
    if spikes:
        i, ref = spikes[0]
        chain.append((int(s[i]), "grad_norm", float(gn[i]), ref))
    if len(bad):
        chain.append((int(s[bad[0]]), "loss", "nan", None))
    chain.sort(key=lambda e: e[0])
    first = chain[0][0]
    fin = np.isfinite(lr_a)
    ch = np.flatnonzero(fin[1:] & fin[:-1] & (np.abs(np.diff(lr_a)) > 1e-3 * np.abs(lr_a[:-1])))
    before_first = [int(i) + 1 for i in ch if s[int(i) + 1] <= first]
    conf = 0.7
    if before_first:
        i = before_first[-1]
        chain.insert(0, (int(s[i]), "lr", float(lr_a[i]), float(lr_a[i - 1])))
        conf = 0.9
    ev: list[Evidence] = []
    for step, metric, value, baseline in chain:
        ev.append({"metric": metric, "step": step, "value": value})
        if baseline is not None:
            ev[-1]["baseline"] = baseline
    return Diagnosis(
        f"instability:{first}",
        "instability",
        "failure",
        conf,
        "training instability: "
        + " -> ".join(
            {"lr": "LR change", "grad_norm": "grad-norm spike", "loss": "NaN loss"}[e[1]]
            for e in chain
        ),
        step=first,
        start_step=chain[0][0],
        end_step=chain[-1][0],
        evidence=ev,
    )


def diagnose_slow_checkpoints(
    steps: Any, durations: Any, times: Any, factor: float = 2.0, min_history: int = 1
) -> list[Diagnosis]:
    """Checkpoint saves over ``factor`` x the median of the earlier ones (storage)."""
    s, d, t = (np.asarray(v, dtype=np.float64) for v in (steps, durations, times))
    out = []
    for i in range(len(d)):
        hist = d[:i][np.isfinite(d[:i])]
        if len(hist) < min_history or not np.isfinite(d[i]):
            continue
        ref = float(np.median(hist))
        if ref > 0 and d[i] > factor * ref:
            out.append(
                Diagnosis(
                    "slow_checkpoint",
                    "slow_checkpoint",
                    "slowdown",
                    0.85,
                    f"checkpoint at step {int(s[i])} took {d[i]:.1f}s vs {ref:.1f}s usual",
                    step=int(s[i]),
                    start_step=int(s[i]),
                    end_step=int(s[i]),
                    time=float(t[i]),
                    evidence=[
                        {
                            "metric": "checkpoint duration",
                            "value": float(d[i]),
                            "baseline": ref,
                            "step": int(s[i]),
                        }
                    ],
                )
            )
    return out
