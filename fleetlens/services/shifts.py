"""The absolute checks' findings (the analysis loop's per-block baseline comparison): a group
of ranks slower than the workload's own baseline, and collectives slower with every rank on time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..analysis.baseline import Baseline, GroupShift, shift_threshold
from ..analysis.evidence import Evidence, window
from ..analysis.hardware import gpu_health, gpu_signals, node_health, node_signals
from ..analysis.nanstats import nanmedian
from ..analysis.rootcause import Diagnosis
from ..store.detect_queries import DetectQueries, JobSpan, Placement

__all__ = ["network_diagnosis", "shift_diagnosis", "throttled_racks"]


def shift_diagnosis(
    q: DetectQueries,
    signature: str,
    job: JobSpan,
    sh: GroupShift,
    place: Placement,
    b: Baseline,
    s0: int,
    s1: int,
    t0: float,
    t1: float,
    rank_vals: Any = None,
    peer: bool = False,
) -> list[Diagnosis]:
    """A group of ranks slower than the workload's baseline over steps ``s0..s1``: the level it
    sits at (rack, switch, NVLink domain, node, job) and whether its GPUs throttled say why.

    A whole job slower, its GPUs throttling, that spans several racks is one finding per rack
    whose GPUs throttle (two hot racks at once are two cooling faults, not one job-wide one);
    ``rank_vals`` (each rank's median compute over the window) gives each rack its ratio. A
    ``peer`` shift (a rack slower than the other ranks, :func:`outlier_groups`) is a finding only
    when half its GPUs or more throttle for heat: the others are no baseline."""
    nodes = sorted({place.node[r] for r in sh.ranks if place.node[r]})
    hot, seen = _hot_gpus(q, nodes, t0, t1)
    thermal = len(hot)
    frac = thermal / max(seen, 1)
    racks = sorted({place.rack[r] for r in sh.ranks if place.rack[r]})
    if peer and frac < 0.5:
        return []
    if sh.level in _BELOW_RACK and frac >= 0.5 and len(racks) == 1:
        hot_rack = _hot_rack(q, signature, job, sh, place, b, s0, s1, t0, t1, rank_vals, racks[0])
        if hot_rack:
            return hot_rack
    if sh.level == "job" and frac >= 0.5 and len(racks) > 1 and rank_vals is not None:
        out = []
        for rack in racks:
            rr = tuple(r for r in sh.ranks if place.rack[r] == rack)
            mine = _gpus(place, rr)
            if 2 * len(mine & hot) < len(mine):
                continue
            with np.errstate(all="ignore"):
                ratio = float(nanmedian(np.asarray(rank_vals)[list(rr)])) / b.median
            out += shift_diagnosis(
                q,
                signature,
                job,
                GroupShift("rack", rack, ratio, rr, sh.ratio),
                place,
                b,
                s0,
                s1,
                t0,
                t1,
            )
        if out:
            return out
    if sh.level == "rack" or (sh.level == "job" and frac >= 0.5):
        diag = "rack_cooling"
    elif sh.level == "switch":
        diag = "network"
    elif sh.level == "nvlink_domain":
        diag = "nvlink"
    elif sh.level == "node":
        diag = "thermal" if frac > 0 else "host"
    else:
        diag = "inefficient_compute"
    ev: list[Evidence] = [
        {
            "metric": "median rank compute / "
            + ("the other ranks'" if peer else "workload baseline"),
            "value": sh.ratio,
            "baseline": 1.0,
            "baseline_median_s": b.median if b.ready else None,
            "threshold": None if peer else 1 + shift_threshold(b, 0.03),
            "others_ratio": sh.others_ratio if np.isfinite(sh.others_ratio) else None,
            "window": window(s0, s1),
            "signature": signature,
        },
        {"metric": "GPUs with thermal throttle reasons", "value": thermal, "of": seen},
    ]
    return [
        Diagnosis(
            f"shift:{sh.level}:{sh.group}",
            diag,
            "slowdown",
            0.85 if thermal else 0.6,
            f"{sh.level} {sh.group}: {len(sh.ranks)} ranks {sh.ratio - 1:.1%} slower than "
            + (
                "the job's other ranks, its GPUs throttling for heat"
                if peer
                else "the workload baseline while the others are not (absolute check)"
            ),
            step=s1,
            start_step=s0,
            end_step=s1,
            time=t1,
            ranks=list(sh.ranks),
            nodes=nodes,
            rack=racks[0] if len(racks) == 1 else "",
            job_id=job.job_id,
            evidence=ev,
        )
    ]


_BELOW_RACK = ("switch", "nvlink_domain", "node")


def throttled_racks(
    q: DetectQueries,
    signature: str,
    job: JobSpan,
    place: Placement,
    s0: int,
    s1: int,
    t0: float,
    t1: float,
    rank_vals: Any,
) -> list[Diagnosis]:
    """Racks most of whose GPUs throttle for heat over steps ``s0..s1``, while the workload's
    baseline is still being learned: there is no baseline to measure a slowdown against yet,
    and when the hot rack holds the whole job no other rack to compare it with either, so the
    GPUs' own throttle reasons say it. The analyzer does not learn such a block as healthy (a
    job hot from its first steps would otherwise be its own baseline). The key is the rack's
    shift finding's, so a later block measured against the baseline continues it."""
    hot, _ = _hot_gpus(q, sorted({n for n in place.node if n}), t0, t1)
    out: list[Diagnosis] = []
    if not hot:
        return out
    vals = np.asarray(rank_vals, dtype=np.float64)
    for rack in sorted({k for k in place.rack if k}):
        rr = [r for r, k in enumerate(place.rack) if k == rack]
        mine = _gpus(place, rr)
        n_hot = len(mine & hot)
        if 2 * n_hot < len(mine):
            continue
        rest = [r for r, k in enumerate(place.rack) if k != rack]
        with np.errstate(all="ignore"):
            ratio = float(nanmedian(vals[rr]) / nanmedian(vals[rest])) if rest else None
        versus = (
            f", {ratio - 1:.1%} slower than the job's other ranks"
            if ratio is not None and np.isfinite(ratio)
            else ""
        )
        ev: list[Evidence] = [
            {
                "metric": "GPUs with thermal throttle reasons",
                "value": n_hot,
                "of": len(mine),
                "window": window(s0, s1),
                "signature": signature,
                "baseline": None,
                "others_ratio": ratio,
            }
        ]
        out.append(
            Diagnosis(
                f"shift:rack:{rack}",
                "rack_cooling",
                "slowdown",
                0.7,
                f"rack {rack}: {n_hot} of its {len(mine)} GPUs throttling for heat{versus}"
                " (the workload's baseline is still being learned)",
                step=s1,
                start_step=s0,
                end_step=s1,
                time=t1,
                ranks=rr,
                nodes=sorted({place.node[r] for r in rr if place.node[r]}),
                rack=rack,
                job_id=job.job_id,
                evidence=ev,
            )
        )
    return out


def _hot_gpus(
    q: DetectQueries, nodes: list[str], t0: float, t1: float
) -> tuple[set[tuple[str, int]], int]:
    """The GPUs of ``nodes`` throttling for heat over ``t0..t1`` (node, GPU), and how many GPUs
    reported."""
    gh = gpu_health(q.gpu_health_rows(nodes, t0, t1))
    return {k for k, g in gh.items() if any(s.name == "thermal" for s in gpu_signals(g))}, len(gh)


def _gpus(place: Placement, ranks: Any) -> set[tuple[str, int]]:
    """The (node, GPU) of each of ``ranks``."""
    return {(place.node[r], int(place.gpu[r])) for r in ranks}


def _hot_rack(
    q: DetectQueries,
    signature: str,
    job: JobSpan,
    sh: GroupShift,
    place: Placement,
    b: Baseline,
    s0: int,
    s1: int,
    t0: float,
    t1: float,
    rank_vals: Any,
    rack: str,
) -> list[Diagnosis]:
    """A group inside one rack, its GPUs throttling for heat, while half the rack's GPUs or more
    throttle: the rack's cooling, seen first where its slowdown crossed the threshold (a rack
    hot from the middle of a block is slow in the median of some of its nodes only; the
    NVLink domain or switch is not at fault)."""
    rr = tuple(r for r, k in enumerate(place.rack) if k == rack)
    if rr == sh.ranks:
        return []
    hot, seen = _hot_gpus(q, sorted({place.node[r] for r in rr if place.node[r]}), t0, t1)
    if 2 * len(hot) < seen:
        return []
    with np.errstate(all="ignore"):
        ratio = (
            float(nanmedian(np.asarray(rank_vals)[list(rr)])) / b.median
            if rank_vals is not None
            else sh.ratio
        )
    return shift_diagnosis(
        q,
        signature,
        job,
        GroupShift("rack", rack, ratio, rr, sh.others_ratio),
        place,
        b,
        s0,
        s1,
        t0,
        t1,
    )


# The host signals that put a slow collective on the network, and how a summary names them.
_NET_SIGNALS = {"retransmits": "TCP retransmits", "nic_errors": "NIC errors",
                "ib_errors": "InfiniBand port errors", "rdma_retries": "RDMA retries"}  # fmt: skip


def network_diagnosis(
    q: DetectQueries,
    job: JobSpan,
    place: Placement,
    tr: float,
    tb: Baseline,
    s0: int,
    s1: int,
    t0: float,
    t1: float,
    key: str,
) -> Diagnosis:
    """Collectives slower than the baseline with every rank on time: NVLink when its GPUs count
    NVLink errors, else the network (with the hosts' TCP, NIC and InfiniBand signals).

    ``key`` names the episode (the attempt and the first block of consecutive slow blocks), the
    same whichever the verdict: a block judged network before its nodes' NVLink errors were
    counted is restated as NVLink by a later block of the episode, not left beside it."""
    nodes = sorted({n for n in place.node if n})
    gh = gpu_health(
        q.gpu_health_rows(nodes, min(t0, job.start), t1)
    )  # counters move slowly: whole attempt
    nh = node_health(q.node_health_rows(nodes, t0, t1))
    nv = sorted(
        {g.node for g in gh.values() if any(s.name == "nvlink_errors" for s in gpu_signals(g))}
    )
    net = [s for h in nh.values() for s in node_signals(h) if s.name in _NET_SIGNALS]
    ev: list[Evidence] = [
        {
            "metric": "collective transfer time (least wait of any rank)",
            "value": tr,
            "baseline": tb.median,
            "window": window(s0, s1),
            "verdict": "slow_network: every rank on time, the transfer itself longer",
        }
    ]
    if nv:
        ev += [
            s.to_dict()
            for g in gh.values()
            if g.node in nv
            for s in gpu_signals(g)
            if s.name == "nvlink_errors"
        ][:8]
        ranks = [r for r, n in enumerate(place.node) if n in nv]
        return Diagnosis(
            key,
            "nvlink",
            "slowdown",
            0.85,
            f"NVLink errors on {', '.join(nv)}; collectives {tr / tb.median:.2f}x slower",
            step=s1,
            start_step=s0,
            end_step=s1,
            time=t1,
            ranks=ranks,
            nodes=nv,
            job_id=job.job_id,
            evidence=ev,
        )
    ev += [
        s.to_dict() | {"node": h}
        for h in sorted(nh)
        for s in node_signals(nh[h])
        if s.name in _NET_SIGNALS
    ][:8]
    return Diagnosis(
        key,
        "network",
        "slowdown",
        0.85 if net else 0.6,
        f"collectives {tr / tb.median:.2f}x slower with every rank on time"
        + (f" ; {', '.join(sorted({_NET_SIGNALS[s.name] for s in net}))} up" if net else ""),
        step=s1,
        start_step=s0,
        end_step=s1,
        time=t1,
        job_id=job.job_id,
        evidence=ev,
    )


def note_hot(js: dict[str, Any], d: Diagnosis) -> None:
    """Keep a rack-cooling finding's span in the attempt's cursor (``hot``: rack, first step,
    last step, ranks), consecutive blocks of one rack merged, for :func:`fold_into_racks`."""
    hot: list[list[Any]] = js.setdefault("hot", [])
    for h in hot:
        if h[0] == d.rack and h[1] <= d.start_step <= h[2] + 1:
            h[2] = max(h[2], d.end_step)
            h[3] = sorted(set(h[3]) | set(d.ranks))
            return
    hot.append([d.rack, d.start_step, d.end_step, sorted(d.ranks)])


def fold_into_racks(
    stragglers: list[Diagnosis], hot: list[list[Any]], margin: int
) -> list[Diagnosis]:
    """The straggler findings a hot rack explains, left out: a GPU of a rack that a rack-cooling
    finding names, slower than its peers from within that finding's span (``margin`` steps
    either side), is that rack's fault seen GPU by GPU, not a fault of its own. The spans are
    the blocks' (a function of the committed steps), so the verdict does not depend on the
    order of the passes. A moving straggler, or one that began outside the span, is kept."""
    out = []
    for d in stragglers:
        covered = (
            d.diagnosis != "straggler.moving"
            and bool(d.ranks)
            and any(
                set(d.ranks) <= set(h[3]) and h[1] - margin <= d.start_step <= h[2] + margin
                for h in hot
            )
        )
        if not covered:
            out.append(d)
    return out
