"""The training-side SDK: ``init`` returns a :class:`Run` whose per-step calls only append.

Layout: ``start`` has ``init``, ``run`` the :class:`Run` (``null`` the disabled one),
``config`` resolves settings, ``buffer`` is the bounded hand-off between threads,
``spans`` times steps/phases/checkpoints, ``exporter`` batches and sends in the background,
``tables`` encodes, ``transport`` speaks HTTP, ``route`` picks the node's relay or the server,
``spool`` keeps what the collector did not take.
Only the standard library and msgspec are imported, because this goes into every training image.
"""

from __future__ import annotations

from .config import SDKConfig
from .null import NullRun
from .run import Run
from .start import init
from .transport import HttpTransport, Transport

__all__ = ["HttpTransport", "NullRun", "Run", "SDKConfig", "Transport", "init"]
