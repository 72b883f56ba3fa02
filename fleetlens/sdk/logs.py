"""The rank's log lines, captured when asked (``FLEETLENS_LOGS=1``, ``init(capture_logs=True)``).

Two sources, each line a ``log`` record (:data:`fleetlens.schema.LOG`) with the step the training
thread is at (the heartbeat's position, :meth:`Run._position`):

- Python ``logging``: every record the application's loggers let through (their levels decide),
  with its level and logger name, taken where records are made (``logging.setLogRecordFactory``)
  so that no handler is added: ``logging.basicConfig`` after ``init`` still configures, and a
  script with no handler still prints its warnings;
- ``sys.stdout`` and ``sys.stderr``: each is replaced by a tee that writes through to the
  original first, untouched, and then keeps each complete line (``stdout`` at INFO, ``stderr``
  at ERROR: where tracebacks go). A carriage return starts the line again, as a terminal shows
  a progress bar: its last state is kept, not every redraw. A line that is a logging record
  just taken, written out by a handler, is not kept twice.

Lines go to the buffer's debug class (P3, dropped first under pressure and counted) and cost no
I/O in the writing thread. A line is cut at :data:`MAX_LINE` characters and at most
:data:`LINES_PER_S` lines a second are kept (a burst of :data:`BURST`), the rest counted as
``log_lines_dropped``; nothing here raises into the caller, and :meth:`LogCapture.close` puts the
streams and the root logger back as they were.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from .buffer import SAMPLE, RecordBuffer

__all__ = ["BURST", "LINES_PER_S", "MAX_LINE", "LogCapture"]

MAX_LINE = 2000
LINES_PER_S = 200.0
BURST = 2000.0
_LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
_ECHO_S = 0.5  # a handler's write of a record follows its making within this, in one thread


class _Budget:
    """A token bucket of lines: :data:`LINES_PER_S` a second, :data:`BURST` at once."""

    def __init__(self) -> None:
        self.tokens = BURST
        self.at = time.monotonic()
        self.dropped = 0

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(BURST, self.tokens + (now - self.at) * LINES_PER_S)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        self.dropped += 1
        return False


def _in_logging() -> bool:
    """Whether this write comes from inside the logging module (a handler's emit)."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_filename == logging.__file__:
            return True
        f = f.f_back  # type: ignore[assignment]
    return False


class _Tee:
    """Writes through to ``stream``, then hands each complete line to ``keep``."""

    def __init__(self, stream: TextIO, keep: Callable[[str], None]) -> None:
        self._stream = stream
        self._keep = keep
        self._part = ""
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def write(self, s: str) -> int:
        n = self._stream.write(s)
        # A forked child (a DataLoader worker) inherits the tee but has no exporter to send
        # its lines, and may inherit the lock held: it only writes through. A writer never
        # waits long for another thread's line either: its line is lost, not the training.
        if os.getpid() != self._pid or not self._lock.acquire(timeout=0.05):
            return n
        try:
            try:
                text = self._part + s
                *lines, self._part = text.split("\n")
                if len(self._part) > MAX_LINE:  # no newline coming: keep what there is
                    lines.append(self._part)
                    self._part = ""
            finally:
                self._lock.release()
            for line in lines:
                line = line.rsplit("\r", 1)[-1]  # a progress bar: its last state
                if line.strip():
                    self._keep(line)
        except Exception:
            pass  # the line is lost, the write stood
        return n

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer, ...
        return getattr(self._stream, name)


class LogCapture:
    """Installs the handler and the tees; ``position`` says the step the training thread is at
    and ``rank`` which rank this is."""

    def __init__(
        self, buffer: RecordBuffer, rank: int, position: Callable[[], tuple[int, str, float]]
    ) -> None:
        self._buffer = buffer
        self._rank = rank
        self._position = position
        self._budget = _Budget()
        self.errors = 0
        self._recent = threading.local()  # this thread's record just taken, for the tees
        self._pid = os.getpid()
        self._factory = logging.getLogRecordFactory()
        logging.setLogRecordFactory(self._record)
        self._streams: list[tuple[str, TextIO, _Tee]] = []
        for name, level in (("stdout", "INFO"), ("stderr", "ERROR")):
            orig = getattr(sys, name)
            if orig is None:
                continue
            tee = _Tee(orig, functools.partial(self._stream_line, level=level, source=name))
            setattr(sys, name, tee)
            self._streams.append((name, orig, tee))

    def _record(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self._factory(*args, **kwargs)
        try:
            if os.getpid() != self._pid or not self._budget.take():
                return record  # a forked child's, or past the budget: not formatted at all
            message = record.getMessage().split("\n", 1)[0]
            level = record.levelname if record.levelname in _LEVELS else "INFO"
            # A handler writing this record to our stdout or stderr does so at once, in this
            # thread: the tee skips that line. A record no handler prints (a file handler, a
            # level filter) expires, so a later print holding its text is still kept.
            self._recent.last = (message, time.monotonic())
            self._line(message, level, record.name, budgeted=True)
        except Exception:
            self.errors += 1
        return record

    def _stream_line(self, line: str, level: str, source: str) -> None:
        last = getattr(self._recent, "last", None)
        if last is not None and last[0] and last[0] in line and _in_logging():
            self._recent.last = None
            if time.monotonic() - last[1] < _ECHO_S:
                return  # a handler writing out the record just taken
        self._line(line, level, source)

    @property
    def dropped(self) -> int:
        return self._budget.dropped

    def _line(
        self, message: str, level: str = "INFO", source: str = "", budgeted: bool = False
    ) -> None:
        try:
            if not budgeted and not self._budget.take():
                return
            step = self._position()[0]
            row = {
                "time": time.time(),
                "rank": self._rank,
                "step": max(step, -1),
                "level": level,
                "source": source[:200],
                "message": message[:MAX_LINE],
            }
            self._buffer.put(3, (SAMPLE, "log", row))
        except Exception:
            self.errors += 1

    def close(self) -> None:
        """The streams and the record factory as they were (one someone replaced since, left as
        it is)."""
        if logging.getLogRecordFactory() == self._record:
            logging.setLogRecordFactory(self._factory)
        for name, orig, tee in self._streams:
            if getattr(sys, name) is tee:
                setattr(sys, name, orig)
        self._streams = []
