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


class _Tee:
    """Writes through to ``stream``, then hands each complete line to ``keep``."""

    def __init__(self, stream: TextIO, keep: Callable[[str], None]) -> None:
        self._stream = stream
        self._keep = keep
        self._part = ""
        self._lock = threading.Lock()

    def write(self, s: str) -> int:
        n = self._stream.write(s)
        try:
            with self._lock:
                text = self._part + s
                *lines, self._part = text.split("\n")
                if len(self._part) > MAX_LINE:  # no newline coming: keep what there is
                    lines.append(self._part)
                    self._part = ""
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
        self._recent = threading.local()  # this thread's records just taken, for the tees
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
            message = record.getMessage().split("\n", 1)[0]
            level = record.levelname if record.levelname in _LEVELS else "INFO"
            recent = getattr(self._recent, "messages", None)
            if recent is None:
                recent = self._recent.messages = []
            recent.append(message)
            del recent[:-8]
            self._line(message, level, record.name)
        except Exception:
            self.errors += 1
        return record

    def _stream_line(self, line: str, level: str, source: str) -> None:
        recent = getattr(self._recent, "messages", None)
        if recent:
            for i, message in enumerate(recent):
                if message and message in line:  # a handler writing out a record just taken
                    del recent[i]
                    return
        self._line(line, level, source)

    @property
    def dropped(self) -> int:
        return self._budget.dropped

    def _line(self, message: str, level: str = "INFO", source: str = "") -> None:
        try:
            if not self._budget.take():
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
