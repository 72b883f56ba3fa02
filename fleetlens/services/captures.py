"""Triggered trace capture (seed 003 s9.3.3): when the always-on step timing finds a rank
lagging, its job profiles a few steps on that rank and on a healthy peer, and the finding shows
the two traces side by side.

The server's half, on the leader (whose memory holds the job's control channel, as the
remediation controller's does):

- a job that can capture says so on each control poll (``capture=1``, ``fleetlens.torch``
  with ``FLEETLENS_TRACE_CAPTURE=1``): :meth:`Captures.offered` notes the rank and answers the
  capture it is part of, if any;
- each monitoring pass (:meth:`Captures.plan`) asks one capture of a run whose open straggler
  or slowdown finding names a rank that offers, with the lowest offering rank the finding does
  not name as its peer: at most one open capture a run, one every ``capture_gap_s``; a capture
  whose traces are not all in within ``capture_timeout_s`` expires;
- a person asks one for any ranks (:meth:`Captures.request`: the API, ``fleetlens traces
  capture``);
- each rank uploads its trace file (gzip Kineto JSON); :meth:`Captures.receive` imports its
  profiled steps as the run's trace rows (``fleetlens traces show``, the run page) and keeps
  the rank's breakdown (:func:`fleetlens.traces.capture.rank_summary`) on the capture, which
  the findings read back as evidence (:func:`fleetlens.store.captures.capture_evidence`).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.attribution import slows_steps
from ..config import AnalyzerConfig
from ..errors import ConfigError, Conflict, TraceFormatError
from ..store.captures import Capture, CaptureStore
from ..store.findings import FindingRow
from ..store.metadata import MetadataStore
from ..store.scope import Scope
from ..traces.capture import capture_batch, rank_summary
from ..traces.importer import RankTrace, analyze
from ..traces.kineto import read_trace

__all__ = ["MAX_RANKS", "MAX_STEPS", "CaptureInstruction", "Captures", "instruction"]

log = logging.getLogger("fleetlens.captures")

MAX_RANKS = 8
"""Ranks one capture may name: a capture is a sample to compare, not a whole-job profile."""
MAX_STEPS = 20
"""Profiled steps one capture may ask for (bounded cost)."""
MAX_TRACE_BYTES = 1 << 30
"""A rank's uploaded trace decompressed: past it the upload is refused (413), nothing kept."""
_OFFER_S = 120.0
"""A rank that has not offered on a poll for this long is no longer counted on."""


_LEAD_S = 10.0
"""How far ahead of the ranks' newest step a capture starts: every rank named hears of it on a
poll (every 2 s, later on a loaded host) before then, so all profile the same steps."""


@dataclass(frozen=True, slots=True)
class CaptureInstruction:
    """What a rank's control poll is told of a capture it is part of: from which step (a rank
    that hears of it later starts at once), how many, after how many warm-up steps."""

    id: int
    steps: int
    warmup: int
    ranks: tuple[int, ...]
    from_step: int


def instruction(c: Capture) -> CaptureInstruction:
    """The instruction of capture ``c`` to the ranks it names."""
    return CaptureInstruction(
        id=c.id, steps=c.steps, warmup=c.warmup, ranks=tuple(c.ranks), from_step=c.from_step
    )


_PACE_S = 20.0
"""A rank's pace is measured over its polls of about this long (one late poll does not make it)."""


@dataclass
class _Offer:
    """A rank's newest poll that offered capture: its job attempt, when, its step, its pace
    (steps a second since ``since``, its oldest poll of the attempt within :data:`_PACE_S`)."""

    job_id: str
    at: float
    step: int
    since: tuple[float, int]
    steps_per_s: float = 0.0


class Captures:
    def __init__(self, metadata: MetadataStore, cfg: AnalyzerConfig) -> None:
        self.store = CaptureStore(metadata)
        self.cfg = cfg
        self._lock = threading.Lock()
        self._create = threading.Lock()  # a check for an open capture and its creation
        self._parsing = threading.BoundedSemaphore(2)
        # (tenant, run) -> rank -> its newest poll that offered capture
        self._offers: dict[tuple[str, str], dict[int, _Offer]] = {}
        self._open: dict[tuple[str, str], Capture] = {}  # at most one open capture a run

    # -- the control channel -------------------------------------------------------------------

    def offered(
        self,
        tenant: str,
        run_id: str,
        rank: int,
        job_id: str,
        step: int,
        now: float,
        world: int = 1,
    ) -> CaptureInstruction | None:
        """Rank ``rank``, at ``step``, can capture: the capture it is asked for, if any."""
        key = (tenant, run_id)
        with self._lock:
            ranks = self._offers.setdefault(key, {})
            prev = ranks.get(rank)
            if prev is None and len(ranks) >= 4 * world + 64:
                return None  # more ranks than the job has: a confused or hostile caller
            since = (now, step)
            if prev is not None and prev.job_id == job_id and step >= prev.step:
                # the window starts at the oldest poll within _PACE_S (the previous one past it)
                since = prev.since if now - prev.since[0] <= _PACE_S else (prev.at, prev.step)
            span = now - since[0]
            pace = (step - since[1]) / span if span > 0 else 0.0
            ranks[rank] = _Offer(job_id, now, step, since, pace)
            c = self._open.get(key)
        if c is None or rank not in c.ranks or rank in c.results:
            return None
        if c.job_id and job_id and c.job_id != job_id:
            return None  # asked of an earlier attempt of the job
        return instruction(c)

    def offering(self, tenant: str, run_id: str, now: float) -> dict[int, _Offer]:
        """The ranks of the run that offered lately, with their newest poll."""
        with self._lock:
            got = dict(self._offers.get((tenant, run_id), {}))
        return {r: o for r, o in got.items() if now - o.at <= _OFFER_S}

    # -- the monitor's pass --------------------------------------------------------------------

    def plan(self, runs: Iterable[tuple[str, str, Sequence[FindingRow]]], now: float) -> None:
        """Refresh the open captures, expire the late ones, and ask one of each run whose
        findings call for it (``runs``: tenant, run, its findings)."""
        self._refresh(now)
        if self.cfg.capture_steps <= 0:
            return
        for tenant, run_id, findings in runs:
            if (tenant, run_id) in self._open:
                continue
            offers = self.offering(tenant, run_id, now)
            if not offers:
                continue
            pick = _pick(findings, offers)
            if pick is None:
                continue
            finding, ranks = pick
            with self._create:  # one open capture a run, whoever asks
                self._ask(tenant, run_id, finding, ranks, offers, now)

    def _ask(
        self,
        tenant: str,
        run_id: str,
        finding: FindingRow,
        ranks: tuple[int, int],
        offers: dict[int, _Offer],
        now: float,
    ) -> None:
        """Ask the capture of ``ranks`` for ``finding``, unless the run has one open or had one
        within ``capture_gap_s`` (checked under ``_create``)."""
        if any(c.open for c in self.store.of_run(tenant, run_id, limit=3)):
            return
        last = self.store.latest(tenant, run_id)
        if last is not None and now - last.requested_at < self.cfg.capture_gap_s:
            return
        c = self.store.create(
            tenant,
            run_id,
            offers[ranks[0]].job_id,
            _start(offers, now),
            ranks,
            self.cfg.capture_steps,
            self.cfg.capture_warmup,
            f"{finding.diagnosis} on rank {ranks[0]} from step {finding.start_step}: "
            f"rank {ranks[1]} is its healthy peer",
            finding.key,
            now,
        )
        log.info("trace capture %d asked of run %s ranks %s", c.id, run_id, list(ranks))
        with self._lock:
            self._open[(tenant, run_id)] = c

    def _refresh(self, now: float) -> None:
        """The open captures as the store has them (another server may have taken a trace or a
        person's request); the ones past ``capture_timeout_s`` expire; old offers go."""
        still: dict[tuple[str, str], Capture] = {}
        for c in self.store.open_captures():
            if now - c.requested_at > self.cfg.capture_timeout_s:
                missing = [r for r in c.ranks if r not in c.results]
                self.store.expire(
                    c.tenant,
                    c.id,
                    f"no trace from rank(s) {', '.join(map(str, missing))} within "
                    f"{self.cfg.capture_timeout_s:.0f} s: the job ended, moved on to another "
                    "attempt, or those ranks do not capture (FLEETLENS_TRACE_CAPTURE=1)",
                )
                continue
            still[(c.tenant, c.run_id)] = c
        with self._lock:
            self._open = still
            for key in list(self._offers):
                ranks = self._offers[key]
                for r in [r for r, o in ranks.items() if now - o.at > _OFFER_S]:
                    del ranks[r]
                if not ranks:
                    del self._offers[key]

    # -- people --------------------------------------------------------------------------------

    def request(
        self, scope: Scope, run_id: str, ranks: Sequence[int], steps: int, now: float
    ) -> Capture:
        """A capture a person asks for (the caller has checked the run). Conflict while the
        run has an open one: one at a time bounds what the job pays."""
        if not ranks or len(set(ranks)) != len(ranks) or len(ranks) > MAX_RANKS:
            raise ConfigError(f"name 1 to {MAX_RANKS} distinct ranks; got {list(ranks)}")
        if not 1 <= steps <= MAX_STEPS:
            raise ConfigError(f"steps is {steps}; 1 to {MAX_STEPS}")
        with self._create:
            return self._request(scope, run_id, ranks, steps, now)

    def _request(
        self, scope: Scope, run_id: str, ranks: Sequence[int], steps: int, now: float
    ) -> Capture:
        for c in self.store.of_run(scope, run_id, limit=5):
            if c.open and now - c.requested_at <= self.cfg.capture_timeout_s:
                raise Conflict(
                    f"capture {c.id} of run {run_id} is still waiting for traces "
                    f"(ranks {list(c.ranks)}); one at a time"
                )
        offers = self.offering(scope.tenant, run_id, now)
        job = offers[ranks[0]].job_id if ranks[0] in offers else ""
        who = scope.actor or "a person"
        c = self.store.create(
            scope.tenant,
            run_id,
            job,
            _start(offers, now),
            ranks,
            steps,
            self.cfg.capture_warmup,
            f"asked by {who}",
            "",
            now,
        )
        with self._lock:
            self._open[(scope.tenant, run_id)] = c
        return c

    # -- the traces ----------------------------------------------------------------------------

    def parse(self, path: Path, rank: int) -> RankTrace:
        """Rank ``rank``'s uploaded trace, analysed; TraceFormatError when it is not a trace
        with profiled steps, TraceTooLarge past :data:`MAX_TRACE_BYTES` of JSON (the upload
        route then keeps nothing)."""
        with self._parsing:  # a trace's JSON can be hundreds of MB: a few at a time
            rt = analyze(read_trace(path, MAX_TRACE_BYTES), rank)  # the rank that sent it
        if not len(rt.steps):
            raise TraceFormatError(
                "the trace has no ProfilerStep# annotation: nothing was profiled"
            )
        return rt

    def receive(
        self,
        scope: Scope,
        run_id: str,
        capture_id: int,
        rt: RankTrace,
        ingest: Callable[[bytes], Any],
    ) -> Capture:
        """Rank ``rt.rank``'s trace of capture ``capture_id``: its steps imported through
        ``ingest`` (one wire batch, stored once however often it is sent), its breakdown kept
        on the capture. NotFound for an unknown capture; Conflict for a rank it did not name."""
        c = self.store.get(scope, run_id, capture_id)
        if rt.rank not in c.ranks:
            raise Conflict(f"capture {capture_id} did not ask rank {rt.rank} ({list(c.ranks)})")
        ingest(capture_batch(rt, run_id, c.job_id, capture_id))
        c = self.store.record(scope, run_id, capture_id, rt.rank, rank_summary(rt))
        with self._lock:
            key = (scope.tenant, run_id)
            if c.open:
                self._open[key] = c
            elif key in self._open and self._open[key].id == c.id:
                del self._open[key]
        log.info("trace capture %d: rank %d in (%s)", capture_id, rt.rank, c.state)
        return c

    def of_run(self, scope: Scope, run_id: str, limit: int = 20) -> list[Capture]:
        return self.store.of_run(scope, run_id, limit)


def _start(offers: dict[int, _Offer], now: float) -> int:
    """The step a capture starts at: the ranks' newest, :data:`_LEAD_S` ahead at their pace."""
    if not offers:
        return 0
    top = max(o.step + o.steps_per_s * (now - o.at) for o in offers.values())
    pace = max(o.steps_per_s for o in offers.values())
    return math.ceil(top + pace * _LEAD_S)


def _pick(
    findings: Sequence[FindingRow], offers: dict[int, _Offer]
) -> tuple[FindingRow, tuple[int, int]] | None:
    """The newest open step-slowing finding whose first rank offers, with the lowest offering
    rank it does not name (its healthy peer); both of one attempt, their pace known."""
    for f in sorted(findings, key=lambda f: -f.start_step):
        if f.end_step is not None or not f.ranks or not slows_steps(f.kind, f.diagnosis):
            continue
        lagging = f.ranks[0]
        # a peer of the same attempt whose pace is known (two polls): the start step is ahead
        peers = sorted(r for r in offers if r not in f.ranks and offers[r].steps_per_s > 0)
        if lagging not in offers or not peers or offers[lagging].steps_per_s <= 0:
            continue
        if offers[peers[0]].job_id == offers[lagging].job_id:
            return f, (lagging, peers[0])
    return None
