"""Import a job's Flight Recorder dumps: read every file, analyse, store the findings at once.

Every file is read and checked before anything is written, so a bad file refuses the whole
import (TraceFormatError naming it, a 400) and the run's findings are left as they were; the
findings are written in one transaction. The missing ranks are placed on their nodes and GPUs
from the job's placement when the server has it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..analysis.flight_recorder import (
    FlightRecorderReport,
    StuckCollective,
    analyze_dumps,
    diagnoses,
    group_summary,
    rank_from_name,
)
from ..analysis.flight_recorder_dump import FlightRecorderDump, load_dump
from ..errors import Conflict, NotFound, TraceFormatError
from ..store.detect_queries import DetectQueries
from ..store.findings import FindingsStore
from ..store.metadata import MetadataStore
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore

__all__ = [
    "DumpFile",
    "FlightRecorderImport",
    "GroupLastCompleted",
    "RankHome",
    "import_flight_recorder",
    "read_dumps",
]


@dataclass(frozen=True)
class DumpFile:
    """One uploaded dump: its file name, the rank when the name does not carry it, its bytes."""

    name: str
    data: bytes
    rank: int | None = None


def read_dumps(files: Sequence[DumpFile]) -> dict[int, FlightRecorderDump]:
    """rank -> its dump, parsed; refuses a file without a rank, two files of one rank, or a
    bad dump."""
    dumps: dict[int, FlightRecorderDump] = {}
    names: dict[int, str] = {}
    for f in files:
        rank = f.rank if f.rank is not None else rank_from_name(f.name)
        if rank is None or rank < 0:
            raise TraceFormatError(
                f"{f.name}: no rank in the file name (PyTorch writes "
                "$TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>); rename it or give its rank"
            )
        if rank in dumps:
            raise TraceFormatError(f"{f.name}: rank {rank} was already given by {names[rank]}")
        dumps[rank], names[rank] = load_dump(f.data, f.name), f.name
    if not dumps:
        raise TraceFormatError("no dumps: send at least one Flight Recorder file")
    return dumps


@dataclass(frozen=True, slots=True)
class GroupLastCompleted:
    """The last collective each rank completed in a process group (rank -> its sequence
    number), the lowest and highest of them, and the ranks at the lowest (when not all equal)."""

    group: str
    desc: str
    min: int
    max: int
    behind: list[int]
    last_completed: dict[int, int]


@dataclass(frozen=True, slots=True)
class RankHome:
    """A rank missing from a stuck collective, where the job placed it (None: not known)."""

    rank: int
    node: str | None
    gpu: int | None
    rack: str | None


@dataclass(frozen=True, slots=True)
class FlightRecorderImport:
    """The dumps' analysis (the ranks that sent one, those missing from a stuck collective,
    the stuck collectives, each group's progress), where the missing ranks ran, and the keys
    of the ``hang`` findings stored."""

    run_id: str
    job_id: str | None
    world: int
    ranks_with_dump: list[int]
    missing_ranks: list[int]
    stuck: list[StuckCollective]
    groups: list[GroupLastCompleted]
    missing: list[RankHome]
    findings: list[str]


def _groups(rep: FlightRecorderReport) -> list[GroupLastCompleted]:
    summary = group_summary(rep, len(rep.progress))
    out = []
    for p in rep.progress:
        g = summary[p.group]
        out.append(
            GroupLastCompleted(
                group=p.group,
                desc=g["desc"],
                min=g["min"],
                max=g["max"],
                behind=g["behind"],
                last_completed=dict(p.last_completed),
            )
        )
    return out


def _home(rank: int, node: str, gpu: int, rack: str) -> RankHome:
    return RankHome(rank=rank, node=node or None, gpu=gpu if gpu >= 0 else None, rack=rack or None)


def import_flight_recorder(
    telemetry: TelemetryStore,
    metadata: MetadataStore,
    scope: Scope,
    run_id: str,
    files: Sequence[DumpFile],
    job_id: str | None = None,
) -> FlightRecorderImport:
    """Analyse the dumps of one job of ``run_id`` and store a ``hang`` finding per stuck
    collective; the answer is the analysis and the findings' keys.

    The dumps of a job the server has never seen make its run (its world size from the dumps:
    the ranks their process groups name; its time from their entries'), when they hold a
    collective at all. Dumps of a job of
    another size than the run's are refused (409) naming both sizes: their ranks would be
    mapped to the wrong nodes."""
    dumps = read_dumps(files)  # a bad file is a 400 before anything is made
    world = analyze_dumps(dumps).world
    try:
        run = metadata.get_run(scope, run_id)
    except NotFound:
        if not any(d.entries for d in dumps.values()):
            raise NotFound(
                f"run {run_id!r} does not exist, and the dumps hold no collective to make it from"
            ) from None
        first, last = _span(dumps)
        metadata.observe(
            scope.tenant,
            run_id,
            job_id=job_id or "",
            project=scope.project or "",
            first=first,
            last=last,
            world_size=world,
            recorded=True,  # a dump is a recording: the run is not live for it
        )
        run = metadata.get_run(scope, run_id)
    if run.world_size and world != run.world_size:
        raise Conflict(
            f"the dumps are of a job of {world} ranks (the ranks their process groups name); "
            f"run {run_id} has {run.world_size}: send them to the run of their job"
        )
    q = DetectQueries(telemetry, scope.tenant)
    if not job_id:
        jobs = metadata.jobs(scope, run_id)
        job_id = jobs[-1].job_id if jobs else ""
    rep = analyze_dumps(dumps, run.world_size)
    place = q.placement(run_id, job_id, rep.world) if job_id else None

    def where(rank: int) -> tuple[str, int, str]:
        return place.of(rank) if place is not None else ("", -1, "")

    found = diagnoses(rep, where, job_id, step=run.last_step, time=time.time())
    stored = FindingsStore(metadata).upsert(scope.tenant, run_id, found)
    return FlightRecorderImport(
        run_id=run_id,
        job_id=job_id or None,
        world=rep.world,
        ranks_with_dump=list(rep.ranks),
        missing_ranks=rep.missing,
        stuck=list(rep.stuck),
        groups=_groups(rep),
        missing=[_home(r, *where(r)) for r in rep.missing],
        findings=[f.key for f in stored],
    )


def _span(dumps: dict[int, FlightRecorderDump]) -> tuple[float, float]:
    """The first and last time the dumps' entries were created (now, when they say none)."""
    ns = [
        e.time_created_ns
        for d in dumps.values()
        for e in d.entries
        if e.time_created_ns is not None
    ]
    if not ns:
        now = time.time()
        return now, now
    return min(ns) / 1e9, max(ns) / 1e9
