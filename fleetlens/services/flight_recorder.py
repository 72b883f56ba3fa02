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
from typing import Any

from ..analysis.flight_recorder import (
    FlightRecorderReport,
    analyze_dumps,
    diagnoses,
    group_summary,
    load_dump,
    rank_from_name,
)
from ..errors import Conflict, NotFound, TraceFormatError
from ..store.detect_queries import DetectQueries
from ..store.findings import FindingsStore
from ..store.metadata import MetadataStore
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore

__all__ = ["DumpFile", "import_flight_recorder", "read_dumps"]


@dataclass(frozen=True)
class DumpFile:
    """One uploaded dump: its file name, the rank when the name does not carry it, its bytes."""

    name: str
    data: bytes
    rank: int | None = None


def read_dumps(files: Sequence[DumpFile]) -> dict[int, dict[str, Any]]:
    """rank -> dump; refuses a file without a rank, two files of one rank, or a bad dump."""
    dumps: dict[int, dict[str, Any]] = {}
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


def _report_json(rep: FlightRecorderReport) -> dict[str, Any]:
    summary = group_summary(rep, len(rep.progress))
    stuck = [
        {
            "group": s.group,
            "desc": s.desc,
            "op": s.op,
            "seq": s.seq,
            "members": list(s.members),
            "missing": list(s.missing),
            "sizes": s.sizes,
            "dtypes": s.dtypes,
        }
        for s in rep.stuck
    ]
    groups = [
        {
            "group": p.group,
            **summary[p.group],
            "lastCompleted": {str(r): n for r, n in p.last_completed.items()},
        }
        for p in rep.progress
    ]
    return {
        "world": rep.world,
        "ranksWithDump": list(rep.ranks),
        "missingRanks": rep.missing,
        "stuck": stuck,
        "groups": groups,
    }


def _home(rank: int, node: str, gpu: int, rack: str) -> dict[str, Any]:
    return {
        "rank": rank,
        "node": node or None,
        "gpu": gpu if gpu >= 0 else None,
        "rack": rack or None,
    }


def import_flight_recorder(
    telemetry: TelemetryStore,
    metadata: MetadataStore,
    scope: Scope,
    run_id: str,
    files: Sequence[DumpFile],
    job_id: str | None = None,
) -> dict[str, Any]:
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
        if not any(d.get("entries") for d in dumps.values()):
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
        job_id = jobs[-1]["jobId"] if jobs else ""
    rep = analyze_dumps(dumps, run.world_size)
    place = q.placement(run_id, job_id, rep.world) if job_id else None

    def where(rank: int) -> tuple[str, int, str]:
        return place.of(rank) if place is not None else ("", -1, "")

    found = diagnoses(rep, where, job_id, step=run.last_step, time=time.time())
    stored = FindingsStore(metadata).upsert(scope.tenant, run_id, found)
    return {
        "runId": run_id,
        "jobId": job_id or None,
        **_report_json(rep),
        "missing": [_home(r, *where(r)) for r in rep.missing],
        "findings": [f.key for f in stored],
    }


def _span(dumps: dict[int, dict[str, Any]]) -> tuple[float, float]:
    """The first and last time the dumps' entries were created (now, when they say none)."""
    ns = [
        int(e["time_created_ns"])
        for d in dumps.values()
        for e in d.get("entries") or []
        if isinstance(e, dict) and isinstance(e.get("time_created_ns"), int)
    ]
    if not ns:
        now = time.time()
        return now, now
    return min(ns) / 1e9, max(ns) / 1e9
