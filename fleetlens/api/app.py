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
from ..alerts.metrics import JobMetrics, StorageMetrics, TenantView
from ..alerts.notifiers import Delivery
from ..alerts.store import AlertStore
from ..collector.commit import CommitMetrics
from ..collector.decode import DecodeLimits
from ..collector.ingest import Ingestor, IngestQueue
from ..collector.pacing import Pacer
from ..collector.quota import TenantLimiter
from ..collector.space import SpaceMetrics
from ..config import ServerConfig
from ..errors import ConfigError, FleetlensError, http_status
from ..services.monitor import Monitor, MonitorMetrics
from ..sigint import keep_sigint
from ..store.access import AccessStore
from ..store.graph_types import CheckpointInfo
from ..store.leader import open_election
from ..store.metadata import MetadataStore
from ..store.retention import retention_days, stored_bytes
from ..store.scope import Scope
from ..store.telemetry import TelemetryStore, open_telemetry
from ..wire import BATCHES_CONTENT_TYPE, Batch
from .admin import router as admin_router
from .alerts import router as alerts_router
from .auth import ERROR_RESPONSES, require, require_any
from .bodies import BodyBudget
from .body_limit import OWN_BODY, BodyLimit
from .captures import router as captures_router
from .evaluations import eval_stores
from .evaluations import router as evaluations_router
from .findings import router as findings_router
from .flight_recorder import UPLOAD_COMPONENTS
from .flight_recorder import router as flight_recorder_router
from .goodput import router as goodput_router
from .graph import router as graph_router
from .incidents import router as incidents_router
from .ingest import IngestApp, error_response, ingest_batch, ingest_batches
from .leader import LeaderClient, LeaderGauge, keep_electing, leader_of
from .logs import router as logs_router
from .memory import router as memory_router
from .ops_models import BATCHES_STORED, INGEST_STORED, HealthOut
from .portal import router as portal_router
from .portal_fleet import router as portal_fleet_router
from .portal_runs import router as portal_runs_router
from .regression import router as regression_router
from .remediation import router as remediation_router
from .runs import router as runs_router
from .scheduler import IMPORT_COMPONENTS
from .scheduler import router as scheduler_router
from .series import router as series_router
from .trace_files import router as trace_files_router
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
    pacer: Pacer = field(init=False)

    def __post_init__(self) -> None:
        self.pacer = Pacer(self.config.collector.max_request_rate)

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
        telemetry = open_telemetry(
            config.telemetry_dir,
            config.clickhouse_url or None,
            retention=retention_days(config.retention),
        )
        try:
            metadata = MetadataStore(config.resolved_database_url)
        except Exception:
            telemetry.close()
            raise
        c = config.collector
        ingestor = Ingestor(
            telemetry,
            metadata,
            DecodeLimits(
                max_body_bytes=c.max_body_bytes,
                max_decoded_bytes=c.max_decoded_bytes,
                max_rows=c.max_rows,
                max_world_size=c.max_world_size,
                max_future_s=c.max_future_s,
                skew_tolerance_s=c.skew_tolerance_s,
            ),
            decode_slots=c.decode_slots,
            min_free_bytes=c.min_free_bytes,
            linger_s=c.commit_linger_s,
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
        if ingestor.committer is not None:
            registry.register(CommitMetrics(ingestor.committer))
        if ingestor.space is not None:
            registry.register(SpaceMetrics(ingestor.space))
        monitor = Monitor.build(config, telemetry, metadata, access, job_metrics)
        registry.register(MonitorMetrics(monitor))
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
            self.ingestor.close()
        self.monitor.close()
        self.metadata.close()
        self.telemetry.close()


def _batch_json_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """The JSON form of a wire batch (and its component schemas), from the decoder's types."""
    (schema,), defs = msgspec.json.schema_components(
        [Batch], ref_template="#/components/schemas/{name}"
    )
    return schema, defs


BATCH_JSON_SCHEMA, BATCH_COMPONENTS = _batch_json_schema()


_BUSY_RESPONSES: dict[int | str, dict[str, Any]] = {
    429: {"description": "Queue full or tenant over its rate; retry after Retry-After"},
    503: {"description": "Store unavailable; nothing acknowledged; retry"},
}
"""What both ingest routes answer when the server cannot take a request now."""


def create_api(config: ServerConfig, services: Services | None = None) -> FastAPI:
    """The API alone (no portal pages); :func:`fleetlens.server.create_app` is the server."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc = services or Services.open(config)
        app.state.services = svc
        evals, _ = eval_stores(app.state)

        def on_checkpoint(tenant: str, run_id: str, ck: CheckpointInfo) -> None:
            project = svc.metadata.get_run(Scope(tenant=tenant, role="viewer"), run_id).project
            evals.fire(
                tenant,
                project,
                "checkpoint",
                run_id=run_id,
                checkpoint_id=ck.checkpoint_id,
                checkpoint_uri=ck.uri,
            )

        svc.ingestor.registry.on_verified_checkpoint = on_checkpoint
        app.state.body_budget = BodyBudget(svc.config.collector.max_queue_bytes)

        await anyio.to_thread.run_sync(svc.refresh_quotas)

        async def registry_flusher() -> None:
            while True:
                await asyncio.sleep(2.0)
                try:
                    await anyio.to_thread.run_sync(svc.ingestor.registry.flush)
                    await anyio.to_thread.run_sync(svc.refresh_quotas)
                except Exception:  # keep serving; the next round retries
                    log.exception("run registry flush failed")

        # Several servers may share a PostgreSQL metadata database: only the leader monitors,
        # alerts and remediates (fleetlens/store/leader.py, fleetlens/api/leader.py).
        election = open_election(svc.metadata.engine, svc.config.advertised_url)
        app.state.leader = election
        app.state.leader_client = LeaderClient()
        leader_gauge = LeaderGauge(election)
        svc.registry.register(leader_gauge)
        await anyio.to_thread.run_sync(election.check)

        async def monitoring() -> None:
            while True:
                await asyncio.sleep(svc.config.monitor.interval_s)
                if not election.is_leader:
                    continue
                try:
                    await anyio.to_thread.run_sync(svc.monitor.run_once)
                except Exception:  # keep serving; the next pass retries
                    log.exception("monitoring pass failed")

        tasks = [
            asyncio.create_task(registry_flusher()),
            asyncio.create_task(monitoring()),
            asyncio.create_task(keep_electing(election, svc.monitor.take_over)),
            asyncio.create_task(keep_sigint()),  # chDB ignores Ctrl-C behind Python's back
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            # A pass in a worker thread runs to its end (to_thread is not abandoned on
            # cancel): wait for it, so the stores are not closed under a running query.
            await asyncio.gather(*tasks, return_exceptions=True)
            svc.registry.unregister(leader_gauge)
            await app.state.leader_client.aclose()
            await anyio.to_thread.run_sync(election.close)
            svc.close()

    app = IngestApp(  # FastAPI, with the ingest fast path in front of its middleware
        title="fleetlens",
        version=__version__,
        description="Where your GPUs' time went, and why.",
        lifespan=lifespan,
        docs_url=None,  # served by fleetlens.ui with the vendored Swagger UI (no CDN)
        redoc_url=None,
    )
    app.add_middleware(BodyLimit)  # the ingest routes read their own bodies (OWN_BODY)

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
    async def fleetlens_error(_request: Request, exc: FleetlensError) -> Response:
        """Every error of the tree, answered with its status from ``errors.STATUS``."""
        status = http_status(exc)
        if status == 503:
            log.error("store error: %s", exc)
            retry = int(getattr(exc, "retry_after", 1))
            return error_response(503, f"store unavailable: {exc}", retry_after=retry)
        if status == 500:
            log.error("unexpected %s: %s", type(exc).__name__, exc)
            return error_response(500, f"{type(exc).__name__}: {exc}")
        return error_response(status, str(exc), getattr(exc, "field", None))

    @app.post(
        "/v1/ingest",
        summary="Ingest a columnar telemetry batch",
        openapi_extra={
            OWN_BODY: True,
            "requestBody": {
                "required": True,
                "content": {
                    "application/msgpack": {"schema": {"type": "string", "format": "binary"}},
                    "application/json": {"schema": BATCH_JSON_SCHEMA},
                },
            },
        },
        responses={
            **ERROR_RESPONSES,
            200: INGEST_STORED,
            400: {
                "description": "Malformed batch, or every row broke a rule; the error names "
                "the field; nothing stored"
            },
            413: {"description": "Batch over the size or row limit; nothing stored"},
            **_BUSY_RESPONSES,
        },
    )
    async def ingest(
        request: Request, scope: Annotated[Scope, Depends(require("ingest"))]
    ) -> Response:
        return await ingest_batch(request, scope)  # served by IngestApp ahead of this

    @app.post(
        "/v1/ingest/batches",
        summary="Ingest many batches in one request (a node relay's), each on its own",
        openapi_extra={
            OWN_BODY: True,
            "requestBody": {
                "required": True,
                "content": {
                    BATCHES_CONTENT_TYPE: {
                        "schema": {
                            "type": "array",
                            "description": "MessagePack array of frames, each one batch as "
                            "its sender encoded it",
                            "items": {
                                "type": "object",
                                "required": ["body"],
                                "properties": {
                                    "body": {"type": "string", "format": "binary"},
                                    "type": {"type": "string", "default": "application/msgpack"},
                                    "encoding": {"type": "string", "default": ""},
                                },
                            },
                        }
                    }
                },
            },
        },
        responses={
            **ERROR_RESPONSES,
            200: BATCHES_STORED,
            400: {"description": "Not an array of batch frames; nothing stored"},
            413: {"description": "Request over the size limit; nothing stored"},
            **_BUSY_RESPONSES,
        },
    )
    async def ingest_many(
        request: Request, scope: Annotated[Scope, Depends(require("ingest"))]
    ) -> Response:
        return await ingest_batches(request, scope)  # served by IngestApp ahead of this

    @app.get(
        "/healthz",
        summary="Liveness, and whether this server leads (several servers)",
        response_model=HealthOut,
    )
    async def healthz(request: Request) -> dict[str, Any]:
        leader = leader_of(request)
        space = request.app.state.services.ingestor.space
        return {
            "status": "ok",
            "version": __version__,
            "leader": leader is None or leader.is_leader,
            "storage": space.health() if space is not None else None,
        }

    @app.get(
        "/metrics",
        summary="Prometheus metrics: the caller's tenant (and project), or every tenant's "
        "infrastructure for the oncall role",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
    )
    async def metrics(
        request: Request, scope: Annotated[Scope, Depends(require_any("read", "read:infra"))]
    ) -> Response:
        svc: Services = request.app.state.services
        registry: Any
        operator = True
        if scope.token_id is None and not svc.auth_required:
            registry = svc.registry  # the single local user of a loopback server
        elif scope.cross_tenant_infra:
            registry = TenantView(svc.registry, scope.tenant, infra_only=True)
        else:
            registry = TenantView(svc.registry, scope.tenant, scope.project)
            operator = False
        body = generate_latest(registry)
        if operator:  # the store's size is every tenant's: the operator's and on-call's only
            sizes = await anyio.to_thread.run_sync(stored_bytes, svc.telemetry)
            body += generate_latest(StorageMetrics(sizes))
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    app.include_router(graph_router)  # before runs: /v1/runs/compare is not a run id
    app.include_router(runs_router)
    app.include_router(memory_router)
    app.include_router(logs_router)
    app.include_router(series_router)
    app.include_router(findings_router)
    app.include_router(flight_recorder_router)
    app.include_router(scheduler_router)
    app.include_router(alerts_router)
    app.include_router(incidents_router)
    app.include_router(traces_router)
    app.include_router(trace_files_router)
    app.include_router(captures_router)
    app.include_router(regression_router)
    app.include_router(goodput_router)
    app.include_router(admin_router)
    app.include_router(portal_router)
    app.include_router(portal_fleet_router)
    app.include_router(portal_runs_router)
    app.include_router(evaluations_router)
    app.include_router(remediation_router)

    build_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build_openapi()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(BATCH_COMPONENTS)
            components.update(UPLOAD_COMPONENTS)
            components.update(IMPORT_COMPONENTS)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
