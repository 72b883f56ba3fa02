"""The server process as ``fleetlens serve`` runs it: the API app with the portal's pages on top.

The portal (``fleetlens.ui``) is a client of the API layer (its pages use the API's
authentication), so the two are assembled here, above both, rather than the API importing the UI.
"""

from __future__ import annotations

import gc

from fastapi import FastAPI

from .api.app import Services, create_api
from .config import ServerConfig
from .ui.headers import SecurityHeaders
from .ui.model_pages import router as model_pages_router
from .ui.pages import router as pages_router
from .ui.runbook_page import router as runbook_router

__all__ = ["Services", "create_app", "settle_heap"]


def create_app(config: ServerConfig, services: Services | None = None) -> FastAPI:
    """The whole server: every API route, ``/metrics``, the OpenAPI document and the portal."""
    app = create_api(config, services)
    app.include_router(pages_router)
    app.include_router(model_pages_router)
    app.include_router(runbook_router)
    app.add_middleware(SecurityHeaders)
    return app


def settle_heap() -> None:
    """Before serving: the objects made so far (modules, classes, the API's models and routes:
    ~180,000) live as long as the process, so they leave the cycle collector's view
    (``gc.freeze``). A full collection then scans only what requests and ingest made since:
    80-100 ms -> 13 ms on this machine after a large ingest (``bench/portal.py``), a pause that
    otherwise lands inside whichever request triggers it. For a server process only: what an
    embedding process (a test) holds at the time would never be collected."""
    gc.collect()
    gc.freeze()
