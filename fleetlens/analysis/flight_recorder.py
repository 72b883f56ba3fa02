"""PyTorch NCCL Flight Recorder dumps: name the stuck collectives and the ranks missing from them.

A job run with ``TORCH_NCCL_TRACE_BUFFER_SIZE > 0`` and ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` writes,
when its watchdog times out, one dump per rank to ``$TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``
(``/tmp/nccl_trace_rank_<rank>`` by default): a pickled dict, or JSON when the job asked for it.
:func:`~fleetlens.analysis.flight_recorder_dump.load_dump` reads one safely and parses it once
into a :class:`~fleetlens.analysis.flight_recorder_dump.FlightRecorderDump`; the analyses here
read only those.

:func:`analyze_dumps` turns the dumps of one job into the answer an on-call engineer needs:
per process group the collective the others wait in and the ranks that never entered it
(:func:`fleetlens.analysis.hangs.missing_from_groups`), and the last collective each rank
completed in each group. :func:`diagnoses` makes them findings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .flight_recorder_dump import FlightRecorderDump, FlightRecorderEntry
from .hangs import flight_recorder_groups, missing_from_groups
from .rootcause import Diagnosis

__all__ = [
    "FlightRecorderReport",
    "GroupProgress",
    "StuckCollective",
    "analyze_dumps",
    "diagnoses",
    "group_summary",
    "rank_from_name",
]

_RANK = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle))?$")


def rank_from_name(name: str) -> int | None:
    """The rank PyTorch appended to the dump's file name (``nccl_trace_rank_12``,
    ``_dump_12.json``), or None when the name does not end in one."""
    m = _RANK.search(name.replace("\\", "/").rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class StuckCollective:
    """A collective some members of ``group`` wait in, and the members that never entered it."""

    group: str
    desc: str
    members: tuple[int, ...]
    seq: int
    op: str
    missing: tuple[int, ...]
    sizes: list[Any] = field(default_factory=list)
    dtypes: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class GroupProgress:
    """The last collective each rank completed in ``group`` (from ``pg_status``, else from the
    completed entries); ranks without a dump or a record are absent."""

    group: str
    desc: str
    last_completed: dict[int, int]


@dataclass(frozen=True)
class FlightRecorderReport:
    world: int
    ranks: tuple[int, ...]  # the ranks that sent a dump
    stuck: list[StuckCollective]
    progress: list[GroupProgress]

    @property
    def missing(self) -> list[int]:
        return sorted({r for s in self.stuck for r in s.missing})


def _desc(dumps: Mapping[int, FlightRecorderDump], group: str) -> str:
    for d in dumps.values():
        cfg = d.pg_config.get(group)
        if cfg is not None and cfg.desc:
            return cfg.desc
        for e in d.entries:
            if e.group_desc is not None and e.group == group:
                return e.group_desc
    return ""


def _entry(
    dumps: Mapping[int, FlightRecorderDump], group: str, seq: int
) -> FlightRecorderEntry | None:
    for d in dumps.values():
        for e in d.entries:
            if e.group == group and e.seq == seq and not e.is_p2p:
                return e
    return None


def _progress(dumps: Mapping[int, FlightRecorderDump]) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for rank, d in dumps.items():
        names: dict[str, str] = {}  # pg_id (per rank) -> group name (global)
        for e in d.entries:
            names[e.pg_id] = e.group
            if e.state == "completed" and not e.is_p2p:
                g = out.setdefault(e.group, {})
                g[rank] = max(g.get(rank, -1), e.seq)
        for pg_id, done in d.last_completed.items():
            if pg_id in names and done >= 0:
                g = out.setdefault(names[pg_id], {})
                g[rank] = max(g.get(rank, -1), done)
    return out


def analyze_dumps(dumps: Mapping[int, FlightRecorderDump], world: int = 0) -> FlightRecorderReport:
    """The stuck collectives and per-group progress of one job's dumps (rank -> dump). The world
    is the largest of ``world``, the ranks sent and the ranks the groups name."""
    members_seen = [r for d in dumps.values() for cfg in d.pg_config.values() for r in cfg.ranks]
    n = max([world, *(r + 1 for r in dumps), *(r + 1 for r in members_seen)])
    last, members, ops = flight_recorder_groups(dumps, n)
    stuck = []
    for s in missing_from_groups(last, members, ops):
        e = _entry(dumps, s.group, s.seq)
        stuck.append(
            StuckCollective(
                s.group,
                _desc(dumps, s.group),
                s.members,
                s.seq,
                s.op,
                s.missing,
                list(e.input_sizes) if e else [],
                list(e.input_dtypes) if e else [],
            )
        )
    progress = [
        GroupProgress(g, _desc(dumps, g), dict(sorted(per.items())))
        for g, per in sorted(_progress(dumps).items(), key=lambda kv: (len(kv[0]), kv[0]))
    ]
    return FlightRecorderReport(n, tuple(sorted(dumps)), stuck, progress)


Where = Callable[[int], tuple[str, int, str]]
"""rank -> (node, GPU index, rack) from the job's placement; ("", -1, "") when unknown."""


def group_summary(report: FlightRecorderReport, limit: int = 64) -> dict[str, dict[str, Any]]:
    """Per group (up to ``limit``): its description, the lowest and highest last completed
    collective over its ranks, and the ranks at the lowest."""
    out = {}
    for p in report.progress[:limit]:
        lo, hi = min(p.last_completed.values()), max(p.last_completed.values())
        behind = [r for r, v in p.last_completed.items() if v == lo] if lo < hi else []
        out[p.group] = {"desc": p.desc, "min": lo, "max": hi, "behind": behind[:64]}
    return out


def diagnoses(
    report: FlightRecorderReport,
    where: Where,
    job_id: str = "",
    step: int = -1,
    time: float | None = None,
) -> list[Diagnosis]:
    """One ``hang`` finding per stuck collective, naming the missing ranks with their nodes and
    GPUs, with the last completed collectives (of the group per rank, of every group in short)
    as evidence. ``step`` is the step the job had reached, when known."""
    out = []
    by_group = {p.group: p for p in report.progress}
    groups = group_summary(report)
    for s in report.stuck:
        homes = [(r, *where(r)) for r in s.missing]
        nodes = sorted({node for _, node, _, _ in homes if node})
        gpus = [f"{node}/{gpu}" for _, node, gpu, _ in homes if node and gpu >= 0]
        racks = sorted({rack for *_, rack in homes if rack})
        at = ", ".join(
            f"{r} ({node} GPU {gpu})" if node else str(r) for r, node, gpu, _ in homes[:16]
        )
        name = f"{s.desc} ({s.group})" if s.desc else s.group
        done = by_group.get(s.group)
        out.append(
            Diagnosis(
                f"fr:{job_id}:{s.group}:{s.seq}",
                "hang",
                "hang",
                0.95,
                f"Flight Recorder: {s.op or 'a collective'} #{s.seq} of process group {name} "
                f"waits for rank(s) {at}, which never entered it",
                step=step,
                start_step=step,
                end_step=step,
                time=time,
                ranks=list(s.missing),
                nodes=nodes,
                gpus=gpus,
                rack=racks[0] if len(racks) == 1 else "",
                job_id=job_id,
                evidence=[
                    {
                        "metric": "stuck collective",
                        "source": "flight_recorder",
                        "group": s.group,
                        "desc": s.desc,
                        "op": s.op,
                        "seq": s.seq,
                        "sizes": s.sizes[:8],
                        "dtypes": s.dtypes[:8],
                        "members": list(s.members[:256]),
                    },
                    {
                        "metric": "ranks missing from the collective",
                        "value": list(s.missing[:64]),
                        "where": [
                            {"rank": r, "node": node or None, "gpu": gpu if gpu >= 0 else None}
                            for r, node, gpu, _ in homes[:64]
                        ],
                    },
                    {
                        "metric": "last completed collective per rank",
                        "group": s.group,
                        "value": {
                            str(r): v
                            for r, v in list((done.last_completed if done else {}).items())[:256]
                        },
                    },
                    {"metric": "last completed collective per group", "value": groups},
                ],
            )
        )
    return out
