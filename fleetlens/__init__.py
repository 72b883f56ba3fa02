"""fleetlens: where your GPUs' time went, and why.

``import fleetlens`` is the training-side SDK::

    run = fleetlens.init(project="llm", config={"lr": 3e-4})
    for i, batch in enumerate(loader):
        with run.step(i, tokens=4096):
            with run.phase("forward"):
                ...
        run.log(i, loss=loss)
    run.finish()

Importing reads no environment and starts nothing; ``init`` does both.

``fleetlens.Client`` reads the server's API (runs, ranks, timeline, goodput, findings) from a
notebook or a script; it needs the ``server`` extra (httpx) and is imported on first use.
``fleetlens.callbacks.huggingface(run)`` and ``fleetlens.callbacks.lightning(run)`` are the
trainers' callbacks, also loaded on first use (no separate import needed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import FleetlensError
from .sdk import Run, SDKConfig, init

if TYPE_CHECKING:
    from . import callbacks
    from .client import Client

__all__ = ["Client", "FleetlensError", "Run", "SDKConfig", "__version__", "callbacks", "init"]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The SDK's import stays stdlib + msgspec: the HTTP client loads only when asked for.
    if name == "Client":
        from .client import Client

        return Client
    if name == "callbacks":
        import importlib

        return importlib.import_module(".callbacks", __name__)
    raise AttributeError(f"module 'fleetlens' has no attribute {name!r}")
