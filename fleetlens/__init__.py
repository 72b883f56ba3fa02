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
"""

from __future__ import annotations

from .errors import FleetlensError
from .sdk import Run, SDKConfig, init

__all__ = ["FleetlensError", "Run", "SDKConfig", "__version__", "init"]

__version__ = "0.1.0"
