"""Which server leads: the one that holds a PostgreSQL advisory lock on the metadata database.

Several ``fleetlens serve`` processes may share one PostgreSQL metadata database. Every one of
them ingests and answers reads; only the leader runs the monitoring pass (detection, alert
evaluation and notification, remediation). The leader is the server whose own connection holds
the session-level advisory lock :data:`LOCK_KEY` (``pg_try_advisory_lock``): PostgreSQL releases
it when that session ends, so a leader that dies (SIGKILL, a lost machine: the session's TCP
keepalives below) frees it, and a follower, trying again every :data:`RETRY_S`, takes over.

The lock's connection carries the leader's URL as its ``application_name``, so a follower finds
where the leader is (to forward a job's control polls) from ``pg_locks`` and
``pg_stat_activity``, with nothing to clean up when the leader goes. The connection must reach
PostgreSQL itself or a session-pooling proxy: under transaction pooling a session lock means
nothing.

SQLite is one server's file: that server always leads (:class:`SoleServer`).
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import URL, Engine
from sqlalchemy.pool import NullPool

from ..errors import ConfigError

__all__ = ["LOCK_KEY", "RETRY_S", "AdvisoryLock", "Election", "SoleServer", "open_election"]

log = logging.getLogger("fleetlens.leader")

LOCK_KEY = 0x466C4C6E
"""The advisory lock's key ("FlLn"); advisory locks are per database, so deployments sharing a
PostgreSQL server but not a database do not contend."""

RETRY_S = 1.0
"""How often a follower tries to take the lock, and a leader checks its connection."""

_TIMEOUT_S = 5
_MAX_NAME = 63  # PostgreSQL keeps application_name to NAMEDATALEN - 1 bytes

_LEADER_URL = text(
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0 AND l.objid = :key "
    "AND l.objsubid = 1 AND l.database = "
    "(SELECT oid FROM pg_database WHERE datname = current_database())"
)


class Election(Protocol):
    """Whether this server leads, and where the leader is."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader_url(self) -> str:
        """The leader's URL ("" while nobody holds the lock, or it is unknown)."""
        ...

    def check(self) -> bool:
        """One round (blocking I/O): keep or try to take the lead; whether this server leads."""
        ...

    def close(self) -> None: ...


class SoleServer:
    """The metadata database is this server's own (SQLite): it always leads."""

    def __init__(self, url: str) -> None:
        self._url = url

    @property
    def is_leader(self) -> bool:
        return True

    @property
    def leader_url(self) -> str:
        return self._url

    def check(self) -> bool:
        return True

    def close(self) -> None:
        pass


class AdvisoryLock:
    """Leadership through ``pg_try_advisory_lock(LOCK_KEY)`` on a connection of its own."""

    def __init__(self, url: URL, advertise: str, key: int = LOCK_KEY) -> None:
        if len(advertise.encode()) > _MAX_NAME:
            raise ConfigError(
                f"advertise URL {advertise!r} is longer than {_MAX_NAME} bytes, which is what "
                "PostgreSQL keeps of the lock's application_name; set a shorter "
                "--advertise-url (an address rather than a long host name)"
            )
        self.key = key
        self.advertise = advertise
        # Both ends watch the lock's connection: the client's TCP timeouts make a leader that
        # lost its database notice within seconds; the server's (the session's keepalive
        # settings) free the lock of a leader whose machine vanished without closing it.
        self._engine: Engine = create_engine(
            url,
            poolclass=NullPool,
            isolation_level="AUTOCOMMIT",
            connect_args={
                "application_name": advertise,
                "connect_timeout": _TIMEOUT_S,
                "keepalives": 1,
                "keepalives_idle": 2,
                "keepalives_interval": 1,
                "keepalives_count": 3,
                "tcp_user_timeout": _TIMEOUT_S * 1000,
                "options": f"-c statement_timeout={_TIMEOUT_S * 1000} "
                "-c tcp_keepalives_idle=2 -c tcp_keepalives_interval=1 "
                f"-c tcp_keepalives_count=3 -c tcp_user_timeout={_TIMEOUT_S * 1000}",
            },
        )
        self._conn: Connection | None = None
        self._lock = threading.Lock()  # a round still running when the server shuts down
        self._leading = False
        self._leader_url = ""

    @property
    def is_leader(self) -> bool:
        return self._leading

    @property
    def leader_url(self) -> str:
        return self.advertise if self._leading else self._leader_url

    def check(self) -> bool:
        with self._lock:
            return self._check()

    def _check(self) -> bool:
        try:
            conn = self._conn if self._conn is not None else self._engine.connect()
            self._conn = conn
            if self._leading:
                conn.execute(text("SELECT 1"))  # the session, and with it the lock, is alive
                return True
            if conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": self.key}).scalar():
                self._set(True)
            else:
                self._leader_url = str(conn.execute(_LEADER_URL, {"key": self.key}).scalar() or "")
        except Exception as exc:
            self._drop()
            self._leader_url = ""
            if self._leading:
                log.error(
                    "lost the lead: the lock's database connection failed (%s)",
                    str(exc).splitlines()[0],
                )
                self._set(False)
            else:
                log.warning(
                    "cannot reach the metadata database to take the lead: %s",
                    str(exc).splitlines()[0],
                )
        return self._leading

    def _set(self, leading: bool) -> None:
        if leading and not self._leading:
            log.warning(
                "this server (%s) leads: it runs monitoring, alerts and remediation", self.advertise
            )
        self._leading = leading

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.invalidate()  # never back into a pool: the session must end
                conn.close()
            except Exception:  # the connection is gone already
                pass

    def close(self) -> None:
        """Give up the lead (the session ends, and the lock with it)."""
        with self._lock:
            if self._leading:
                log.warning("this server (%s) gives up the lead", self.advertise)
            self._leading = False
            self._drop()
            self._engine.dispose()


def open_election(engine: Engine, advertise: str) -> Election:
    """The election a metadata database allows: a lock on PostgreSQL, a sole server on SQLite."""
    if engine.dialect.name == "postgresql":
        return AdvisoryLock(engine.url, advertise)
    return SoleServer(advertise)
