"""The placement checked against the parallel layout: tensor-parallel groups inside one NVLink
domain (seed 002: "tensor-parallel groups physically verified to land on NVLink-connected nodes").

A tensor-parallel group all-reduces activations in every layer, forward and backward; split over
two NVLink domains, those all-reduces cross the network, an order of magnitude slower. The
layout is Megatron-LM's (and torchtitan's, DeepSpeed's): the TP size comes from the run's config
(any of the names :mod:`fleetlens.analysis.layout` reads) and TP groups are runs of
consecutive ranks, ``[k * tp, (k + 1) * tp)``. A rank's domain is its placement's NVLink domain
when the placement names one, else its node. Ranks with no placement yet are not judged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .layout import config_size
from .rootcause import Diagnosis

__all__ = ["SplitGroup", "split_tp_groups", "tp_size", "tp_split"]


@dataclass(frozen=True)
class SplitGroup:
    ranks: tuple[int, ...]
    domains: tuple[str, ...]  # the distinct domains its ranks are on, sorted


def tp_size(config: dict[str, Any]) -> int | None:
    """The run's tensor-parallel size from its config, or None when it does not say (or 1)."""
    tp = config_size(config, "tp")
    return tp if tp is not None and tp > 1 else None


def split_tp_groups(
    tp: int, world: int, node: Sequence[str], nvlink_domain: Sequence[str]
) -> list[SplitGroup]:
    """The TP groups whose placed ranks sit in more than one domain."""
    out: list[SplitGroup] = []
    for first in range(0, world - world % tp, tp):
        ranks = range(first, first + tp)
        where = {
            (nvlink_domain[r] if r < len(nvlink_domain) and nvlink_domain[r] else node[r])
            for r in ranks
            if r < len(node) and node[r]
        }
        if len(where) > 1:
            out.append(SplitGroup(tuple(ranks), tuple(sorted(where))))
    return out


def tp_split(
    config: dict[str, Any],
    job_id: str,
    steps: tuple[int, int],
    start: float,
    node: Sequence[str],
    nvlink_domain: Sequence[str],
    world: int,
) -> list[Diagnosis]:
    """The attempt's ``topology`` finding when its TP groups are split (else none); ``steps``
    are its first and last step, ``start`` its start time."""
    tp = tp_size(config)
    if tp is None or world < tp:
        return []
    split = split_tp_groups(tp, world, node, nvlink_domain)
    if not split:
        return []
    first = split[0]
    ranks = sorted({r for g in split for r in g.ranks})
    return [
        Diagnosis(
            f"topology:{job_id}",
            "topology",
            "slowdown",
            0.95,
            f"{len(split)} of {world // tp} tensor-parallel groups of {tp} ranks span NVLink "
            f"domains (ranks {first.ranks[0]}-{first.ranks[-1]} on "
            f"{', '.join(first.domains[:4])}): "
            "their every-layer all-reduces cross the network; place each group on one node or "
            "NVLink domain (Slurm --distribution=block, a topology-aware scheduler)",
            step=steps[0],
            start_step=steps[0],
            end_step=steps[1],
            time=start,
            ranks=ranks[:256],
            nodes=sorted({d for g in split for d in g.domains})[:64],
            job_id=job_id,
            evidence=[
                {
                    "metric": "tensor-parallel groups split",
                    "value": len(split),
                    "of": world // tp,
                    "tp": tp,
                    "groups": [
                        {"ranks": list(g.ranks), "domains": list(g.domains)} for g in split[:8]
                    ],
                }
            ],
        )
    ]
