"""The API app: the collector (``POST /v1/ingest``) and the read API. The portal's pages are
added on top of it by :func:`fleetlens.server.create_app`, which is what ``fleetlens serve`` runs.

Ingest does its decoding and inserting on a worker thread, inside a bounded number of slots:
when they are all taken the answer is 429 with Retry-After, and the client (the SDK) backs off
and spools. A store failure is a 503 with Retry-After: nothing was acknowledged, so the client
retries, and deduplication keeps the retry from being stored twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import anyio
import msgspec
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from .. import __version__
from ..alerts.metrics import JobMetrics, TenantView
from ..alerts.notifiers import Delivery
from ..alerts.store import AlertStore
from ..collector.decode import DecodeLimits
from ..collector.ingest import Ingestor, IngestQueue
from ..collector.quota import TenantLimiter
from ..config import ServerConfig
from ..errors import BatchTooLarge, ConfigError, FleetlensError, WireError, http_status
from ..services.monitor import Monitor
from ..store.access import AccessStore
from ..store.metadata import MetadataStore
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore, open_telemetry
from ..wire import Batch
from .admin import router as admin_router
from .alerts import router as alerts_router
from .auth import ERROR_RESPONSES, caller, require
from .evaluations import router as evaluations_router
from .findings import router as findings_router
from .flight_recorder import router as flight_recorder_router
from .goodput import router as goodput_router
from .graph import router as graph_router
from .portal import router as portal_router
from .portal_fleet import router as portal_fleet_router
from .remediation import router as remediation_router
from .runs import router as runs_router
from .series import router as series_router
from .traces import router as traces_router

__all__ = ["Services", "create_api"]

log = logging.getLogger("fleetlens.server")


@dataclass
class Services:
    config: ServerConfig
    telemetry: TelemetryStore
    metadata: MetadataStore
    ingestor: Ingestor
    queue: IngestQueue
    access: AccessStore
    limiter: TenantLimiter
    auth_required: bool
    registry: CollectorRegistry
    batches: Counter
    rows: Counter
    monitor: Monitor
    ingested_bytes: dict[str, int] = field(default_factory=dict)
    quotas: dict[str, dict[str, int]] = field(default_factory=dict)
    # (tenant, project, run) a job's control poll was checked against, so it is checked once
    control_runs: set[tuple[str, str, str]] = field(default_factory=set)

    def refresh_quotas(self) -> None:
        """Reload quotas into the limiter and persist the bytes ingested since the last call."""
        pending, self.ingested_bytes = self.ingested_bytes, {}
        if pending:
            self.access.add_ingested(pending)
        quotas = {}
        for tenant in set(self.limiter.tenants()) | set(self.quotas) | set(pending) | {"default"}:
            quotas[tenant] = q = self.access.quotas(tenant)
            self.limiter.set_rate(tenant, float(q["ingest_bytes_per_s"]))
        self.quotas = quotas

    def load_quota(self, tenant: str) -> None:
        """Quotas of a tenant seen for the first time since the last refresh."""
        self.quotas[tenant] = q = self.access.quotas(tenant)
        self.limiter.set_rate(tenant, float(q["ingest_bytes_per_s"]))

    def storage_left(self, tenant: str) -> int | None:
        """Bytes the tenant may still ingest under its stored-bytes quota (None: unlimited)."""
        q = self.quotas.get(tenant)
        if not q or not q["stored_bytes"]:
            return None
        return int(q["stored_bytes"] - q["ingested_bytes"] - self.ingested_bytes.get(tenant, 0))

    @classmethod
    def open(cls, config: ServerConfig) -> Services:
        os.makedirs(config.data_dir, exist_ok=True)
        telemetry = open_telemetry(config.telemetry_dir, config.clickhouse_url or None)
        try:
            metadata = MetadataStore(config.resolved_database_url)
        except Exception:
            telemetry.close()
            raise
        ingestor = Ingestor(
            telemetry,
            metadata,
            DecodeLimits(
                max_body_bytes=config.collector.max_body_bytes, max_rows=config.collector.max_rows
            ),
        )
        registry = CollectorRegistry()
        batches = Counter(
            "fleetlens_ingest_batches",
            "Batches received, by outcome",
            ["outcome"],
            registry=registry,
        )
        rows = Counter(
            "fleetlens_ingest_rows", "Rows stored, by record kind", ["kind"], registry=registry
        )
        queue = IngestQueue(config.collector.max_inflight, config.collector.max_queue_bytes)
        access = AccessStore(metadata)
        auth_required = config.auth_required
        if auth_required and not access.has_admin_token():
            metadata.close()
            telemetry.close()
            raise ConfigError(
                "this server requires tokens (it binds to a non-loopback address or has "
                "--auth required) and none exists yet: create an admin token with "
                f"`fleetlens tokens create --data {config.data_dir} --tenant NAME --role admin`"
            )
        job_metrics = JobMetrics()
        registry.register(job_metrics)
        monitor = Monitor.build(config, telemetry, metadata, access, job_metrics)
        return cls(
            config,
            telemetry,
            metadata,
            ingestor,
            queue,
            access,
            TenantLimiter(),
            auth_required,
            registry,
            batches,
            rows,
            monitor,
        )

    @property
    def alert_store(self) -> AlertStore:
        return self.monitor.alerts

    @property
    def delivery(self) -> Delivery:
        return self.monitor.delivery

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ingestor.flush_registry()
        self.monitor.close()
        self.metadata.close()
        self.telemetry.close()


def _error(
    status: int, message: str, field: str | None = None, retry_after: int | None = None
) -> JSONResponse:
    """An error answer. ``detail`` is FastAPI's key (its own 4xx use it), ``error`` the key the
    collector has always answered with; both carry the message, ``field`` the bad field."""
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    body = {"detail": message, "error": message, "field": field}
    return JSONResponse(body, status_code=status, headers=headers)


def _batch_json_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """The JSON form of a wire batch (and its component schemas), from the decoder's types."""
    (schema,), defs = msgspec.json.schema_components(
        [Batch], ref_template="#/components/schemas/{name}"
    )
    return schema, defs


BATCH_JSON_SCHEMA, BATCH_COMPONENTS = _batch_json_schema()


async def _drain(request: Request) -> None:
    """Read and discard the body, so the client sees our answer instead of a reset."""
    async for _chunk in request.stream():
        pass


def create_api(config: ServerConfig, services: Services | None = None) -> FastAPI:
    """The API alone (no portal pages); :func:`fleetlens.server.create_app` is the server."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc = services or Services.open(config)
        app.state.services = svc

        await anyio.to_thread.run_sync(svc.refresh_quotas)

        async def registry_flusher() -> None:
            while True:
                await asyncio.sleep(2.0)
                try:
                    await anyio.to_thread.run_sync(svc.ingestor.flush_registry)
                    await anyio.to_thread.run_sync(svc.refresh_quotas)
                except Exception:  # keep serving; the next round retries
                    log.exception("run registry flush failed")

        async def monitoring() -> None:
            while True:
                await asyncio.sleep(svc.config.monitor.interval_s)
                try:
                    await anyio.to_thread.run_sync(svc.monitor.run_once)
                except Exception:  # keep serving; the next pass retries
                    log.exception("monitoring pass failed")

        tasks = [asyncio.create_task(registry_flusher()), asyncio.create_task(monitoring())]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            svc.close()

    app = FastAPI(
        title="fleetlens",
        version=__version__,
        description="Where your GPUs' time went, and why.",
        lifespan=lifespan,
    )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # FastAPI makes one route per method; Allow must list every method of the path.
            allowed: set[str] = set()
            for route in app.routes:
                match, _ = route.matches({**request.scope, "method": "GET"})
                methods = getattr(route, "methods", None)
                if match != Match.NONE and methods:
                    allowed |= set(methods)
            headers["Allow"] = ", ".join(sorted(allowed))
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(FleetlensError)
    async def fleetlens_error(_request: Request, exc: FleetlensError) -> JSONResponse:
        """Every error of the tree, answered with its status from ``errors.STATUS``."""
        status = http_status(exc)
        if status == 503:
            log.error("store error: %s", exc)
            return _error(503, f"store unavailable: {exc}", retry_after=1)
        if status == 500:
            log.error("unexpected %s: %s", type(exc).__name__, exc)
            return _error(500, f"{type(exc).__name__}: {exc}")
        return _error(status, str(exc), getattr(exc, "field", None))

    @app.post(
        "/v1/ingest",
        summary="Ingest a columnar telemetry batch",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/msgpack": {"schema": {"type": "string", "format": "binary"}},
                    "application/json": {"schema": BATCH_JSON_SCHEMA},
                },
            }
        },
        responses={
            **ERROR_RESPONSES,
            200: {"description": "Stored durably (or already stored: batches are idempotent)"},
            400: {"description": "Malformed batch; the error names the field; nothing stored"},
            413: {"description": "Batch over the size or row limit; nothing stored"},
            429: {"description": "Queue full or tenant over its rate; retry after Retry-After"},
            503: {"description": "Store unavailable; nothing acknowledged; retry"},
        },
    )
    async def ingest(
        request: Request, scope: Annotated[Scope, Depends(require("ingest"))]
    ) -> Response:
        svc: Services = request.app.state.services
        limit = svc.config.collector.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            svc.batches.labels("too_large").inc()
            await _drain(request)
            return _error(413, f"body is {declared} bytes; the limit is {limit}", None)
        nbytes = int(declared) if declared is not None and declared.isdigit() else limit
        if scope.tenant not in svc.quotas:
            await anyio.to_thread.run_sync(svc.load_quota, scope.tenant)
        left = svc.storage_left(scope.tenant)
        if left is not None and left <= 0:
            svc.batches.labels("over_quota").inc()
            await _drain(request)
            return _error(
                403,
                f"tenant {scope.tenant!r} has used its stored-bytes quota; "
                "ask the platform operator to raise it (fleetlens tenants quota)",
            )
        wait = svc.limiter.take(scope.tenant, nbytes)
        if wait > 0:
            svc.batches.labels("over_quota").inc()
            await _drain(request)
            return _error(
                429,
                f"tenant {scope.tenant!r} is over its ingest rate; retry later",
                retry_after=max(1, math.ceil(wait)),
            )
        if not await svc.queue.admit(nbytes, svc.config.collector.queue_wait_s):
            svc.batches.labels("throttled").inc()
            await _drain(request)
            return _error(429, "ingest queue is full; retry later", None, retry_after=1)
        try:
            chunks: list[bytes] = []
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    svc.batches.labels("too_large").inc()
                    await _drain(request)
                    return _error(413, f"body is over the limit of {limit} bytes")
                chunks.append(chunk)
            body = b"".join(chunks)
            try:
                result = await anyio.to_thread.run_sync(
                    svc.ingestor.ingest,
                    body,
                    request.headers.get("content-type", "application/msgpack"),
                    request.headers.get("content-encoding", ""),
                    scope.tenant,
                    scope.project or None,
                )
            except WireError as exc:
                too_large = isinstance(exc, BatchTooLarge)
                svc.batches.labels("too_large" if too_large else "rejected").inc()
                return _error(http_status(exc), str(exc), exc.field)
        finally:
            await svc.queue.release(nbytes)
        svc.batches.labels("stored").inc()
        svc.ingested_bytes[scope.tenant] = svc.ingested_bytes.get(scope.tenant, 0) + len(body)
        for kind, n in result.rows.items():
            svc.rows.labels(kind).inc(n)
        return JSONResponse({"batchId": result.batch_id, "rows": result.rows, "status": "stored"})

    @app.get("/healthz", summary="Liveness")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @app.get(
        "/metrics",
        summary="Prometheus metrics: the caller's tenant, or every tenant for the oncall role",
        response_class=Response,
    )
    async def metrics(request: Request, scope: Annotated[Scope, Depends(caller)]) -> Response:
        svc: Services = request.app.state.services
        everything = scope.cross_tenant_infra or (not svc.auth_required and scope.actor == "local")
        registry: Any = svc.registry if everything else TenantView(svc.registry, scope.tenant)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(graph_router)  # before runs: /v1/runs/compare is not a run id
    app.include_router(runs_router)
    app.include_router(series_router)
    app.include_router(findings_router)
    app.include_router(flight_recorder_router)
    app.include_router(alerts_router)
    app.include_router(traces_router)
    app.include_router(goodput_router)
    app.include_router(admin_router)
    app.include_router(portal_router)
    app.include_router(portal_fleet_router)
    app.include_router(evaluations_router)
    app.include_router(remediation_router)

    build_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build_openapi()
            schema.setdefault("components", {}).setdefault("schemas", {}).update(BATCH_COMPONENTS)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
