"""Ctrl-C keeps stopping the server and the demo.

The embedded ClickHouse engine (chDB) sets SIGINT to be ignored a few seconds after it starts
(the process's ``SigIgn`` in ``/proc/PID/status`` gains SIGINT and SIGQUIT), behind Python's
back: ``signal.getsignal`` still names the handler that was there. ``fleetlens serve`` and
``fleetlens demo`` then stayed deaf to Ctrl-C (SIGTERM still stopped them). So the handler the
process meant to have is put back, every second, from the main thread.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import Any

__all__ = ["keep_sigint", "restore_sigint"]


def restore_sigint(handler: Any = None) -> None:
    """Install ``handler`` (Python's Ctrl-C by default) for SIGINT again, from the main thread;
    elsewhere, nothing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handler or signal.default_int_handler)


async def keep_sigint(every: float = 1.0) -> None:
    """On the main thread's event loop (``fleetlens serve``): keep the SIGINT handler it has now
    (the server's) installed. Elsewhere (the demo's server thread), return at once."""
    if threading.current_thread() is not threading.main_thread():
        return
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        return
    while True:
        await asyncio.sleep(every)
        restore_sigint(handler)
