"""The metadata store: the run graph's entities in SQL (SQLite embedded, PostgreSQL at scale).

Schema changes go through Alembic migrations (``fleetlens/store/migrations``); opening a store
upgrades its database to the newest revision, so an older data directory keeps working.
Every method takes the caller's tenant and scopes its statements with :func:`.scoped.scoped`;
the one read across tenants (:meth:`MetadataStore.active_runs`, the monitoring loop's) says so.
The other stores of this database open their sessions with :meth:`MetadataStore.session`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, select, text
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ..errors import ConfigError, NotFound, StoreError
from ..lifecycle import JobVerdict, RankEnd, job_verdict, more_telling
from .models import Finding, Job, RankEndRow, Run
from .scope import Scope
from .scoped import all_tenants, scoped

__all__ = [
    "RECORDED",
    "JobInfo",
    "MetadataStore",
    "RunBrief",
    "RunInfo",
    "retry_conflicts",
    "run_status",
]

T = TypeVar("T")

RECORDED = "RECORDED"
"""The status of a run known only from recordings of its past (profiler traces, Flight Recorder
dumps): nothing live ever came from it, so it is neither running nor stalled, and nothing says
how it ended. Its first live data makes it a live run like any other."""

STALE_AFTER_S = 300.0
"""A run with no data for this long is reported STALLED rather than RUNNING (HUNG while the
analysis holds a hang of its newest attempt open)."""

_MIGRATIONS = os.path.join(os.path.dirname(__file__), "migrations")
_MIGRATE_KEY = 0x466C4D67  # "FlMg": the advisory lock the servers of one database migrate under


@dataclass(frozen=True)
class RunBrief:
    """A run as a scan over many reads it: its ids, config and times, nothing derived."""

    run_id: str
    project: str
    config: dict[str, Any]
    world_size: int
    first_seen: float
    last_seen: float


@dataclass(frozen=True)
class JobInfo:
    """A job attempt of a run (a restart is a new job)."""

    job_id: str
    status: str
    first_seen: float
    last_seen: float
    last_step: int
    world_size: int
    """As the job declared it (0: not declared)."""


@dataclass(frozen=True)
class RunInfo:
    tenant: str
    project: str
    experiment_id: str
    run_id: str
    status: str
    first_seen: float
    last_seen: float
    last_step: int
    world_size: int
    jobs: int
    config: dict[str, Any]
    ended: JobVerdict | None = None  # how the newest attempt ended, when it has


def run_status(stored: str, status_at: float, last_seen: float, now: float) -> str:
    """RECORDED for a run known only from recordings; FINISHED or FAILED if that was the last
    word and no data came after it; else by age."""
    if stored == RECORDED:
        return RECORDED
    if stored in ("FINISHED", "FAILED") and status_at >= last_seen - 1e-6:
        return stored
    return "RUNNING" if now - last_seen < STALE_AFTER_S else "STALLED"


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def retry_conflicts(work: Callable[[], T], attempts: int = 3) -> T:
    """Run ``work``, a unit of work that creates a row when it is missing, again when another
    writer created the same row first (its unique key's IntegrityError): the next try finds the
    row and updates it. The ranks of a job starting together, or two collectors, race so."""
    for attempt in range(attempts):
        try:
            return work()
        except StoreError as exc:
            if not isinstance(exc.__cause__, IntegrityError) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


class MetadataStore:
    def __init__(self, url: str) -> None:
        if "://" not in url:
            raise ConfigError(
                f"--database-url {url!r} is not a database URL; use sqlite:///PATH or "
                "postgresql+psycopg://user:password@host/db"
            )
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url[len("postgresql://") :]
        try:
            self.engine: Engine = create_engine(url, pool_pre_ping=True)
        except Exception as exc:
            raise ConfigError(f"cannot use database URL {url!r}: {exc}") from exc
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.upgrade()

    def upgrade(self) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", _MIGRATIONS)
        try:
            with self.engine.begin() as conn:
                if conn.dialect.name == "postgresql":  # servers starting together migrate once
                    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATE_KEY})
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot migrate the metadata database: {exc}") from exc

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A unit of work: committed when the block ends, rolled back (StoreError) on a
        database error."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except SQLAlchemyError as exc:
            session.rollback()
            raise StoreError(f"metadata store error: {exc}") from exc
        finally:
            session.close()

    _session = session  # the old name, still used by services/monitor.py and two tests

    def observe(
        self,
        tenant: str,
        run_id: str,
        *,
        job_id: str = "",
        project: str = "",
        experiment_id: str = "",
        first: float,
        last: float,
        step: int = -1,
        world_size: int = 0,
        recorded: bool = False,
    ) -> None:
        """Record that data of a run (and job attempt) covering ``first..last`` arrived: live
        data, or a recording of the past (``recorded``: a profiler trace, a dump), which makes a
        run it creates :data:`RECORDED` until live data of it arrives."""

        def write() -> None:
            with self.session() as s:
                self._observe(
                    s,
                    tenant,
                    run_id,
                    job_id,
                    project,
                    experiment_id,
                    first,
                    last,
                    step,
                    world_size,
                    recorded,
                )

        retry_conflicts(write)

    @staticmethod
    def _observe(
        s: Session,
        tenant: str,
        run_id: str,
        job_id: str,
        project: str,
        experiment_id: str,
        first: float,
        last: float,
        step: int,
        world_size: int,
        recorded: bool = False,
    ) -> None:
        run = s.scalars(scoped(select(Run), tenant).where(Run.run_id == run_id)).first()
        if run is None:
            run = Run(
                tenant=tenant,
                run_id=run_id,
                project=project,
                experiment_id=experiment_id,
                status=RECORDED if recorded else "RUNNING",
                status_at=0.0,
                first_seen=first,
                last_seen=last,
                last_step=step,
                world_size=world_size,
                config={},
                arrivals=1,
            )
            s.add(run)
        else:
            # In SQL, so that two collectors writing at once both count (row-locked increment).
            run.arrivals = Run.arrivals + 1
            run.first_seen = min(run.first_seen, first)
            run.last_seen = max(run.last_seen, last)
            run.last_step = max(run.last_step, step)
            run.project = run.project or project
            run.experiment_id = run.experiment_id or experiment_id
            if world_size and (run.status == RECORDED or not recorded):
                run.world_size = world_size  # the ranks a trace holds do not size a live run
            if run.status == RECORDED and not recorded:
                run.status = "RUNNING"  # live at last: judged like any other run from now on
        if not job_id:
            return
        job = s.scalars(
            scoped(select(Job), tenant).where(Job.run_id == run_id, Job.job_id == job_id)
        ).first()
        if job is None:
            s.add(
                Job(
                    tenant=tenant,
                    run_id=run_id,
                    job_id=job_id,
                    status="RUNNING",
                    first_seen=first,
                    last_seen=last,
                    last_step=step,
                    world_size=world_size,
                )
            )
        else:
            job.first_seen = min(job.first_seen, first)
            job.last_seen = max(job.last_seen, last)
            job.last_step = max(job.last_step, step)
            if world_size:
                job.world_size = world_size

    def set_status(
        self,
        tenant: str,
        run_id: str,
        status: str,
        at: float,
        *,
        job_id: str = "",
        config: dict[str, Any] | None = None,
    ) -> None:
        """Record a lifecycle status (FINISHED, FAILED, RUNNING) and, if given, the config."""
        with self.session() as s:
            run = s.scalars(scoped(select(Run), tenant).where(Run.run_id == run_id)).first()
            if run is None:
                raise NotFound(f"run {run_id!r} does not exist")
            if at >= run.status_at:
                run.status, run.status_at = status, at
            if config is not None:
                run.config = config
            if job_id:
                job = s.scalars(
                    scoped(select(Job), tenant).where(Job.run_id == run_id, Job.job_id == job_id)
                ).first()
                if job is not None:
                    job.status = status

    def record_end(self, tenant: str, run_id: str, job_id: str, end: RankEnd) -> None:
        """Keep ``end`` as its rank's last word in the attempt if it tells more than the one
        kept (:func:`fleetlens.lifecycle.more_telling`)."""

        def write() -> None:
            with self.session() as s:
                row = s.scalars(
                    scoped(select(RankEndRow), tenant).where(
                        RankEndRow.run_id == run_id,
                        RankEndRow.job_id == job_id,
                        RankEndRow.rank == end.rank,
                    )
                ).first()
                if row is None:
                    s.add(
                        RankEndRow(
                            tenant=tenant,
                            run_id=run_id,
                            job_id=job_id,
                            rank=end.rank,
                            state=end.state,
                            at=end.at,
                            step=end.step,
                            message=end.message[:1024],
                        )
                    )
                    return
                old = RankEnd(row.rank, row.state, row.at, row.step, row.message)
                if more_telling(old, end):
                    row.state, row.at, row.step = end.state, end.at, end.step
                    row.message = end.message[:1024]

        retry_conflicts(write)

    def lifecycle(self, s: Session, run: Run, now: float) -> tuple[str, JobVerdict | None]:
        """The run's status and, once its newest attempt ended, how: from its ranks' last
        words (:func:`fleetlens.lifecycle.job_verdict`); a run none of whose ranks said
        a last word yet (or an older data directory's) is RUNNING or STALLED by the age of its
        data, or keeps the status its last lifecycle event set."""
        job = s.scalars(
            scoped(select(Job), run.tenant)
            .where(Job.run_id == run.run_id)
            .order_by(Job.first_seen.desc(), Job.id.desc())
            .limit(1)
        ).first()
        rows = (
            []
            if job is None
            else s.scalars(
                scoped(select(RankEndRow), run.tenant).where(
                    RankEndRow.run_id == run.run_id, RankEndRow.job_id == job.job_id
                )
            ).all()
        )
        if run.status == RECORDED:
            return RECORDED, None
        if job is not None and not rows and self._hung(s, run, job.job_id):
            return "HUNG", None
        if job is None or not rows:
            return run_status(run.status, run.status_at, run.last_seen, now), None
        ends = [RankEnd(r.rank, r.state, r.at, r.step, r.message) for r in rows]
        world = job.world_size or run.world_size
        verdict = job_verdict(world, ends, run.last_seen, now, job.last_step)
        if verdict is None:
            return ("RUNNING" if now - run.last_seen < STALE_AFTER_S else "STALLED"), None
        return verdict.status, verdict

    @staticmethod
    def _hung(s: Session, run: Run, job_id: str) -> bool:
        """Whether the analysis holds a hang of this attempt open (no end step yet)."""
        q = scoped(select(Finding.id), run.tenant).where(
            Finding.run_id == run.run_id,
            Finding.kind == "hang",
            Finding.job_id == job_id,
            Finding.end_step < 0,
        )
        return s.scalars(q.limit(1)).first() is not None

    def status_of(self, run: Run, now: float) -> tuple[str, JobVerdict | None]:
        """:meth:`lifecycle` in a session of its own (for a run read earlier)."""
        with self.session() as s:
            return self.lifecycle(s, run, now)

    def _info(self, s: Session, run: Run, now: float) -> RunInfo:
        jobs = s.scalars(
            scoped(select(Job.job_id), run.tenant).where(Job.run_id == run.run_id)
        ).all()
        status, ended = self.lifecycle(s, run, now)
        return RunInfo(
            tenant=run.tenant,
            project=run.project,
            experiment_id=run.experiment_id,
            run_id=run.run_id,
            status=status,
            first_seen=run.first_seen,
            last_seen=run.last_seen,
            last_step=run.last_step,
            world_size=run.world_size,
            jobs=len(jobs),
            config=dict(run.config or {}),
            ended=ended,
        )

    def list_runs(
        self,
        scope: Scope,
        project: str | None = None,
        limit: int = 100,
        offset: int = 0,
        since: float | None = None,
    ) -> list[RunInfo]:
        """Runs, most recently active first; ``since``: only those with data at or after it."""
        now = time.time()
        with self.session() as s:
            q = scoped(select(Run), scope, within="project")
            if project:
                q = q.where(Run.project == project)
            if since is not None:
                q = q.where(Run.last_seen >= since)
            q = q.order_by(Run.last_seen.desc(), Run.run_id).limit(limit).offset(offset)
            return [self._info(s, r, now) for r in s.scalars(q).all()]

    def run_briefs(self, scope: Scope, project: str, limit: int) -> list[RunBrief]:
        """The project's most recently active runs, in one query (no status, no jobs)."""
        with self.session() as s:
            cols = (Run.run_id, Run.project, Run.config, Run.world_size, Run.first_seen)
            q = scoped(select(*cols, Run.last_seen), scope, Run).where(Run.project == project)
            rows = s.execute(q.order_by(Run.last_seen.desc(), Run.run_id).limit(limit)).all()
            return [
                RunBrief(r[0], r[1], dict(r[2] or {}), int(r[3] or 0), r[4], r[5]) for r in rows
            ]

    def get_run(self, scope: Scope, run_id: str) -> RunInfo:
        """The run, if the caller may see it; NotFound otherwise (whether or not it exists)."""
        with self.session() as s:
            q = scoped(select(Run), scope, within="project").where(Run.run_id == run_id)
            run = s.scalars(q).first()
            if run is None:
                raise NotFound(f"run {run_id!r} does not exist")
            return self._info(s, run, time.time())

    def jobs(self, scope: Scope, run_id: str) -> list[JobInfo]:
        """The run's job attempts, oldest first."""
        self.get_run(scope, run_id)
        with self.session() as s:
            rows = s.scalars(
                scoped(select(Job), scope).where(Job.run_id == run_id).order_by(Job.first_seen)
            ).all()
            return [
                JobInfo(j.job_id, j.status, j.first_seen, j.last_seen, j.last_step, j.world_size)
                for j in rows
            ]

    def active_runs(self, since: float, limit: int) -> list[Run]:
        """Runs of every tenant with data since ``since``, most recently active first (the
        monitoring loop's scan; the server's own process, not a caller's read)."""
        with self.session() as s:
            q = all_tenants(select(Run)).where(Run.last_seen >= since)
            return list(s.scalars(q.order_by(Run.last_seen.desc()).limit(limit)).all())

    def close(self) -> None:
        self.engine.dispose()
