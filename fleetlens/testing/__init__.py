"""The harness the tests and the benchmarks share, one of each thing.

- ``Server``: ``fleetlens serve`` in a process of its own on a loopback port (the process tier);
  ``InProcessServer``: the same app in this process through ASGI (the API tier). Both answer
  ``get``, ``request`` and ``post`` alike.
- ``postgres``: a throwaway PostgreSQL cluster; ``free_port``.
- ``step_batch``: a wire batch of per-rank step records; ``scalar_grid``: one of many metric
  names at every step; ``wait_until``: poll, never sleep;
  ``wait_passes``: wait for the server's monitoring passes; ``serve_page``: a recorded exporter
  page (dcgm-exporter's) served on loopback.
"""

from __future__ import annotations

from .batches import scalar_grid, step_batch
from .exporter import serve_page
from .inprocess import InProcessServer
from .process import Server, free_port, postgres
from .waits import monitor_passes, wait_passes, wait_until

__all__ = [
    "InProcessServer",
    "Server",
    "free_port",
    "monitor_passes",
    "postgres",
    "scalar_grid",
    "serve_page",
    "step_batch",
    "wait_passes",
    "wait_until",
]
