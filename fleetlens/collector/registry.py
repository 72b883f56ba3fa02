"""The run registry: what each stored batch says about its run, job and ranks.

After a batch is durable, the collector keeps the metadata store's view of the run current: the
run and job exist, their first and last times, last step and world size (written at once for a
job's first batch and for lifecycle events, else at most every 2 s per job), how each rank's
part ended (``finish``, ``failure``...), and what the SDK said about the run graph (checkpoints,
code, dataset, config). What a SIGKILL lost of it is rebuilt at startup from the per-step rollup
(:meth:`RunRegistry.recover`), so the last step a restarted server shows is the last one it
acknowledged.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import select

from ..lifecycle import END_STATE_OF_EVENT, RankEnd
from ..schema import KINDS
from ..store.graph_types import CheckpointInfo
from ..store.metadata import MetadataStore
from ..store.models import Job
from ..store.run_queries import job_extents
from ..store.scoped import all_tenants
from ..store.telemetry import TelemetryStore
from .decode import DecodedBatch, StringColumn

log = logging.getLogger("fleetlens.collector")

__all__ = ["RunRegistry"]

_OBSERVE_EVERY_S = 2.0
_GRAPH_EVENTS = frozenset({"checkpoint_end", "job_start", "config_change"})
_STATUS_BY_EVENT = {"finish": "FINISHED", "failure": "FAILED", "job_start": "RUNNING"}


@dataclass
class _Seen:
    project: str
    experiment_id: str
    first: float
    last: float
    step: int
    world_size: int
    written_at: float = 0.0
    dirty: bool = True
    declared: int = 0  # the world size the job's placement declared
    recorded: bool = False  # every batch so far a recording (a profiler trace), none live


_RECORDINGS = frozenset({"trace_step", "trace_kernel", "collective"})
"""What an import of a profiler trace sends: a run made of these alone is RECORDED, not live."""


def _recording(batch: DecodedBatch) -> bool:
    """Whether the batch's run records are a recording of the past (a profiler trace's steps
    and collectives) rather than live telemetry (steps, events, heartbeats)."""
    kinds = {k for k, (n, _) in batch.tables.items() if n and "run_id" in KINDS[k].ctx}
    return "trace_step" in kinds and kinds <= _RECORDINGS


class RunRegistry:
    """The registry writes of the collector, one per server (thread-safe)."""

    def __init__(
        self, telemetry: TelemetryStore, metadata: MetadataStore, max_world_size: int
    ) -> None:
        self.telemetry = telemetry
        self.metadata = metadata
        self.max_world_size = max_world_size
        self._seen: dict[tuple[str, str, str], _Seen] = {}
        self._lock = threading.Lock()
        # Called with (tenant, run_id, checkpoint) for a checkpoint recorded with its checksum
        # (verified); the server starts the evaluations its triggers ask for.
        self.on_verified_checkpoint: Callable[[str, str, CheckpointInfo], object] | None = None

    def declared(self, tenant: str, ctx: dict[str, str]) -> int:
        """The world size the job's placement or start declared (0: none yet)."""
        with self._lock:
            seen = self._seen.get((tenant, ctx.get("run_id", ""), ctx.get("job_id", "")))
            return seen.declared if seen is not None else 0

    def recover(self) -> int:
        """Bring the registry's last step and last-seen time up to what telemetry holds.

        The registry is written at most every 2 s per job, so a SIGKILL can lose the last
        seconds of it while the batches were durable and acknowledged. The per-step rollup has
        the truth: one GROUP BY per job, and a registry write only where it is behind. Returns
        the number of jobs brought up to date.
        """
        tab = job_extents(self.telemetry)
        if not tab.num_rows:
            return 0
        with self.metadata.session() as s:
            have = {
                (r.tenant, r.run_id, r.job_id): (r.last_step, r.last_seen)
                for r in s.execute(  # the registry of every tenant, rebuilt at startup
                    all_tenants(
                        select(Job.tenant, Job.run_id, Job.job_id, Job.last_step, Job.last_seen)
                    )
                )
            }
        fixed = 0
        for r in tab.to_pylist():
            key = (r["r_tenant"], r["r_run"], r["r_job"])
            step, last = int(r["r_step"]), float(r["r_last"])
            known = have.get(key)
            if known is not None and known[0] >= step and known[1] >= last:
                continue
            first = float(r["r_first"])
            if not (np.isfinite(first) and np.isfinite(last)):
                continue
            self.metadata.observe(key[0], key[1], job_id=key[2], first=first, last=last, step=step)
            fixed += 1
        if fixed:
            log.warning("run registry: %d job(s) brought up to date from telemetry", fixed)
        return fixed

    def register(self, batch: DecodedBatch, ctx: dict[str, str]) -> None:
        """Keep the run registry current without a metadata write per batch."""
        run_id = ctx.get("run_id", "")
        if not run_id:
            return
        tenant, job_id = ctx["tenant"], ctx.get("job_id", "")
        times: list[float] = []
        step, world, declared = -1, 0, 0
        for kind, (n, cols) in batch.tables.items():
            # Only the run's own records say it is alive: device samples of its nodes go on
            # after it finished, and would otherwise make a finished run look like a hang.
            if n == 0 or "run_id" not in KINDS[kind].ctx:
                continue
            t = cols.get("time")
            if isinstance(t, np.ndarray):
                times += [float(t.min()), float(t.max())]
            s = cols.get("step")
            if kind in ("step", "trace_step") and isinstance(s, np.ndarray):
                step = max(step, int(s.max()))
            r = cols.get("rank")
            if kind in ("step", "trace_step") and isinstance(r, np.ndarray):
                world = max(world, int(r.max()) + 1)
            w = cols.get("world_size")
            if kind == "placement" and isinstance(w, np.ndarray):
                declared = max(declared, int(w.max()))
            if kind == "event":
                declared = max(declared, _started_world(cols, self.max_world_size))
        if not times:
            return  # nothing of the run itself in this batch (e.g. only device samples)
        key = (tenant, run_id, job_id)
        now = time.monotonic()
        world = declared or world  # a declared world size wins over the ranks seen
        recorded = _recording(batch)
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                seen = self._seen[key] = _Seen(
                    ctx.get("project", ""),
                    ctx.get("experiment_id", ""),
                    min(times),
                    max(times),
                    step,
                    world,
                    declared=declared,
                    recorded=recorded,
                )
                was_recorded = recorded
            else:
                was_recorded = seen.recorded
                seen.first, seen.last = min(seen.first, *times), max(seen.last, *times)
                seen.step = max(seen.step, step)
                seen.declared = max(seen.declared, declared)
                seen.world_size = seen.declared or max(seen.world_size, world)
                seen.recorded = seen.recorded and recorded
                seen.dirty = True
            write = seen.written_at == 0.0 or now - seen.written_at >= _OBSERVE_EVERY_S
            # A recording (one batch per traced rank, imported once) is written at once, so
            # the run has its ranks when the import returns; live data after a recording too:
            # the run is live from then on.
            write = write or recorded or was_recorded != seen.recorded
            if write:
                seen.written_at, seen.dirty = now, False
                record = _Seen(**seen.__dict__)
            else:  # only this batch's span: lifecycle events below need the run to exist
                record = _Seen("", "", min(times), max(times), step, seen.world_size)
                record.recorded = recorded
        events = batch.tables.get("event")
        if write or events:
            self._observe(key, record)
        if events:
            self._lifecycle(tenant, run_id, job_id, events[1])

    def _lifecycle(self, tenant: str, run_id: str, job_id: str, cols: dict[str, Any]) -> None:
        kinds, times, attrs = cols["kind"], cols["time"], cols.get("attrs")
        if not isinstance(kinds, StringColumn):
            return
        values = kinds.values()
        attr_values = attrs.values() if isinstance(attrs, StringColumn) else None
        steps, ranks, messages = cols.get("step"), cols.get("rank"), cols.get("message")
        texts = messages.values() if isinstance(messages, StringColumn) else None
        for i, kind in enumerate(values):
            if kind in _GRAPH_EVENTS and attr_values is not None:
                step = int(steps[i]) if isinstance(steps, np.ndarray) else -1
                self._graph_event(
                    tenant, run_id, job_id, kind, float(times[i]), step, attr_values[i]
                )
            state = END_STATE_OF_EVENT.get(kind)
            if state is not None and job_id:
                rank = int(ranks[i]) if isinstance(ranks, np.ndarray) else -1
                step = int(steps[i]) if isinstance(steps, np.ndarray) else -1
                end = RankEnd(
                    max(rank, -1),
                    state,
                    float(times[i]),
                    step,
                    texts[i] if texts is not None else "",
                )
                self.metadata.record_end(tenant, run_id, job_id, end)
            status = _STATUS_BY_EVENT.get(kind)
            if status is None:
                continue
            config = None
            if kind == "job_start" and attr_values is not None:
                parsed = json.loads(attr_values[i])
                if isinstance(parsed.get("config"), dict):
                    config = parsed["config"]
            self.metadata.set_status(
                tenant, run_id, status, float(times[i]), job_id=job_id, config=config
            )

    def _graph_event(
        self, tenant: str, run_id: str, job_id: str, kind: str, at: float, step: int, raw: str
    ) -> None:
        """What the SDK told about the run graph: its checkpoints, dataset, code, config."""
        from ..errors import ConfigError
        from ..store.graph import GraphStore
        from ..store.scope import Scope

        parsed = json.loads(raw)
        a = parsed if isinstance(parsed, dict) else {}
        graph = GraphStore(self.metadata)
        scope = Scope(tenant=tenant, role="editor", actor="collector")
        try:
            if kind == "checkpoint_end":
                size, dur = a.get("size_bytes"), a.get("duration_s")
                ck = graph.record_checkpoint(
                    scope,
                    run_id,
                    int(a.get("step", step)),
                    uri=str(a.get("path") or ""),
                    job_id=job_id,
                    size_bytes=int(size) if isinstance(size, (int, float)) else None,
                    checksum=_checksum(a),
                    duration_s=float(dur) if isinstance(dur, (int, float)) else None,
                    sync=bool(a.get("sync", True)),
                    ok=bool(a.get("ok", True)),
                    at=at,
                    checkpoint_id=str(a.get("checkpoint_id") or ""),
                )
                hook = self.on_verified_checkpoint
                if hook is not None and ck.checksum and ck.ok:
                    try:
                        hook(tenant, run_id, ck)
                    except Exception:  # an evaluation that cannot start never fails ingest
                        log.exception("evaluation trigger on checkpoint %s failed", ck)
            elif kind == "job_start":
                env = {k: a[k] for k in ("python", "sdk", "hostname") if k in a}
                env.update(a.get("environment") or {})
                launch = a.get("launch_command")
                graph.describe_run(
                    scope,
                    run_id,
                    code=a.get("code") or None,
                    dataset=a.get("dataset") or None,
                    launch_command=str(launch) if launch else None,
                    environment=env or None,
                )
            elif kind == "config_change" and "key" in a:
                info = self.metadata.get_run(scope, run_id)
                graph.describe_run(
                    scope, run_id, config={**info.config, str(a["key"]): a.get("new")}
                )
        except ConfigError:
            pass  # a malformed hint from a training job never fails its batch

    def flush(self) -> None:
        """Write every pending run observation (called at shutdown)."""
        with self._lock:
            pending = [(k, _Seen(**v.__dict__)) for k, v in self._seen.items() if v.dirty]
            for _, v in self._seen.items():
                v.dirty = False
        for key, seen in pending:
            self._observe(key, seen)

    def _observe(self, key: tuple[str, str, str], s: _Seen) -> None:
        tenant, run_id, job_id = key
        self.metadata.observe(
            tenant,
            run_id,
            job_id=job_id,
            project=s.project,
            experiment_id=s.experiment_id,
            first=s.first,
            last=s.last,
            step=s.step,
            world_size=s.world_size,
            recorded=s.recorded,
        )


def _started_world(cols: dict[str, Any], limit: int) -> int:
    """The world size a ``job_start`` event states (the SDK's and the log importers' attrs),
    for a job whose steps one rank reports for all (an imported log)."""
    kinds, attrs = cols.get("kind"), cols.get("attrs")
    if not isinstance(kinds, StringColumn) or not isinstance(attrs, StringColumn):
        return 0
    world = 0
    values = None
    for i, kind in enumerate(kinds.values()):
        if kind != "job_start":
            continue
        values = values if values is not None else attrs.values()
        try:
            w = json.loads(values[i]).get("world_size")
        except (ValueError, AttributeError):
            continue
        if isinstance(w, int) and not isinstance(w, bool) and 0 < w <= limit:
            world = max(world, w)
    return world


def _checksum(attrs: dict[str, Any]) -> str:
    """A checkpoint event's digest as ``sha256:HEX``: ``fleetlens.torch`` sends ``sha256``, an
    explicit ``checksum`` (any algorithm, prefixed) wins."""
    if attrs.get("checksum"):
        return str(attrs["checksum"])
    digest = attrs.get("sha256")
    return f"sha256:{digest}" if isinstance(digest, str) and digest else ""
