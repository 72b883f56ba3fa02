"""The web portal's HTML pages: a shell per page; the data comes from the JSON API.

Each page is a small ``string.Template`` shell with headings, labelled tables and chart hosts;
``static/app.js`` fetches the page's JSON document (``/v1/runs/{id}/overview``,
``/v1/portal/oncall``, ...) and draws it with ``static/charts.js``; the run and rank pages add
``static/run.js`` and ``static/plots.js`` over uPlot (vendored, ``static/vendor/uplot/``), and
the run page then fetches its below-the-fold heatmap and slowest ranks
(``/v1/runs/{id}/heatmap?slowest=8``). Live pages refetch on an interval instead of reloading.
An unknown run's page is an HTML 404 page. The one write a page makes is approving a
remediation action (``POST /v1/remediations/{id}/approve``, with the page's token). Pages stay
out of the OpenAPI schema.

Signing in: the token lives in the tab's ``sessionStorage`` and ``app.js`` sends it as a Bearer
header with each fetch; a browser navigating to a page sends no header. So on a server that
requires tokens, a request for a shell without one is served the shell (it holds no data: the
run page's only datum is the id from its own URL), marked ``data-auth="required"``, and the
script shows its sign-in form instead of fetching. A request that carries a token, and every
request to a server that does not require one, is checked like any API route
(``require("read")``): a run the caller may not see is a 404 here too. The on-call page also
takes ``read:infra`` (role oncall), as its document does; the others send an on-call token there.
The static files need no token.
"""

from __future__ import annotations

import functools
import gzip
import html
import json
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Path, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

from ..api.auth import require_any
from ..api.names_models import CodeNamesOut
from ..errors import NotFound
from ..store.scope import Scope
from .templates import (
    CAPACITY,
    EARLY_OVERVIEW,
    FAILURE,
    NOT_FOUND,
    ONCALL,
    PLOT_HEAD,
    PLOT_SCRIPTS,
    RANK,
    RUN,
    RUNS,
    SHELL,
    SIGNIN,
)

# The codes' plain names (fleetlens/names.py), in every page for app.js's labels: a code keeps
# its name in a tooltip. "</" cannot end the script element early.
NAMES_JSON = json.dumps(CodeNamesOut.all().model_dump(by_alias=True)).replace("</", "<\\/")

__all__ = ["Reader", "page", "router"]

router = APIRouter(include_in_schema=False)

STATIC = {
    "charts.js": "text/javascript",
    "plots.js": "text/javascript",
    "app.js": "text/javascript",
    "run.js": "text/javascript",
    "models.js": "text/javascript",
    "style.css": "text/css",
}


def _services(request: Request) -> Any:
    return request.app.state.services


def _reader(*permissions: str) -> Callable[[Request], Awaitable[Scope | None]]:
    """The caller's scope if its role grants one of ``permissions``; None for a request without
    a token to a server that requires one (a browser navigating: it is served the shell, whose
    script asks for the token)."""
    check = require_any(*permissions)

    async def dependency(request: Request) -> Scope | None:
        if _services(request).auth_required and "authorization" not in request.headers:
            return None
        return await check(request)

    return dependency


Reader = Annotated[Scope | None, Depends(_reader("read"))]
"""A page's reader: the caller's scope, or None for a browser navigating to a server that
requires tokens (its script asks for one)."""
OnCallReader = Annotated[Scope | None, Depends(_reader("read", "read:infra"))]


def page(
    request: Request,
    name: str,
    title: str,
    body: str,
    *,
    run_id: str = "",
    object_id: str = "",
    script: str = "",
    plots: bool = False,
    public: bool = False,
    status: int = 200,
    early: str = "",
) -> HTMLResponse:
    """A page's shell: ``name`` is the page app.js draws, ``object_id`` the model or evaluation
    it shows, ``script`` a static script that draws it (loaded after app.js, it registers its
    pages in ``FLApp.pages``), ``plots`` the charts' scripts (uPlot and plots.js); a
    ``public`` page (its body holds no data, e.g. the runbooks) shows without a token."""
    text = SHELL.substitute(
        page=name,
        title=html.escape(title),
        heading=html.escape(title),
        run_attr=html.escape(run_id, quote=True),
        object_attr=html.escape(object_id, quote=True),
        auth="required" if _services(request).auth_required and not public else "optional",
        signin=SIGNIN,
        body=body,
        head=PLOT_HEAD if plots else "",
        early=early,
        names=NAMES_JSON,
        scripts=(PLOT_SCRIPTS if plots else "")
        + (f'\n<script src="/ui/static/{html.escape(script)}"></script>' if script else ""),
    )
    return HTMLResponse(text, status_code=status, headers={"Cache-Control": "no-store"})


def _page(
    request: Request,
    name: str,
    title: str,
    body: str,
    run_id: str = "",
    plots: bool = False,
    status: int = 200,
) -> HTMLResponse:
    return page(request, name, title, body, run_id=run_id, plots=plots, status=status)


async def _visible_run(request: Request, scope: Scope | None, run_id: str) -> HTMLResponse | None:
    """None if the caller may see the run (or sent no token: the shell then asks for one);
    else the 404 page, in HTML, for a person who followed a link or typed a URL."""
    if scope is None:
        return None
    try:
        await anyio.to_thread.run_sync(_services(request).metadata.get_run, scope, run_id)
    except NotFound as exc:
        body = NOT_FOUND.substitute(why=html.escape(str(exc)))
        return _page(request, "notfound", f"Run {run_id}", body, status=404)
    return None


@router.get("/", response_class=HTMLResponse)
async def runs_page(request: Request, scope: Reader) -> HTMLResponse:
    return page(request, "runs", "Runs", RUNS, script="models.js")


@router.get("/runs/{run_id}", response_class=HTMLResponse)
async def run_page(request: Request, run_id: str, scope: Reader) -> HTMLResponse:
    missing = await _visible_run(request, scope, run_id)
    return missing or page(
        request,
        "run",
        f"Run {run_id}",
        RUN,
        run_id=run_id,
        plots=True,
        script="run.js",
        early=EARLY_OVERVIEW,
    )


@router.get("/runs/{run_id}/ranks/{rank}", response_class=HTMLResponse)
async def rank_page(
    request: Request, run_id: str, rank: Annotated[int, Path(ge=0, le=2**31 - 1)], scope: Reader
) -> HTMLResponse:
    missing = await _visible_run(request, scope, run_id)
    title = f"Run {run_id}: rank {rank}"
    return missing or page(request, "rank", title, RANK, run_id=run_id, plots=True, script="run.js")


@router.get("/runs/{run_id}/failure", response_class=HTMLResponse)
async def failure_page(request: Request, run_id: str, scope: Reader) -> HTMLResponse:
    missing = await _visible_run(request, scope, run_id)
    return missing or _page(request, "failure", f"Run {run_id}: failure", FAILURE, run_id)


@router.get("/oncall", response_class=HTMLResponse)
async def oncall_page(request: Request, scope: OnCallReader) -> HTMLResponse:
    return _page(request, "oncall", "On-call", ONCALL)


@router.get("/capacity", response_class=HTMLResponse)
async def capacity_page(request: Request, scope: Reader) -> HTMLResponse:
    return _page(request, "capacity", "Capacity", CAPACITY, plots=True)


@router.get("/ui/static/{name}")
async def static(name: str) -> Response:
    if name not in STATIC:
        raise HTTPException(404, f"no static file {name!r}")
    data = resources.files("fleetlens.ui").joinpath("static", name).read_bytes()
    return Response(data, media_type=STATIC[name], headers={"Cache-Control": "max-age=300"})


# Vendored from npm (static/vendor/*/README.md): Swagger UI for /docs, uPlot for the charts.
VENDOR = {
    "swagger-ui": {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css"},
    "uplot": {"uPlot.iife.min.js": "text/javascript", "uPlot.min.css": "text/css"},
}


@functools.cache
def _vendor_gz(package: str, name: str) -> bytes:
    raw = resources.files("fleetlens.ui").joinpath("static", "vendor", package, name)
    return gzip.compress(raw.read_bytes(), 6)


@router.get("/ui/static/vendor/{package}/{name}", include_in_schema=False)
async def vendor_asset(request: Request, package: str, name: str) -> Response:
    """Served gzipped (Swagger UI's 1.7 MB of JavaScript is 0.5 MB compressed; uPlot's 51 kB,
    23 kB) and cached by the browser."""
    media = VENDOR.get(package, {}).get(name)
    if media is None:
        raise HTTPException(404, f"no static file {package}/{name!r}")
    body = await anyio.to_thread.run_sync(_vendor_gz, package, name)
    headers = {"Cache-Control": "max-age=86400", "Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("accept-encoding", ""):
        headers["Content-Encoding"] = "gzip"
    else:
        body = gzip.decompress(body)
    return Response(body, media_type=media, headers=headers)


@router.get("/docs", include_in_schema=False)
async def api_docs(request: Request) -> HTMLResponse:
    """The API's interactive docs, from the vendored Swagger UI: they work offline."""
    return get_swagger_ui_html(
        openapi_url=request.app.openapi_url or "/openapi.json",
        title="fleetlens API",
        swagger_js_url="/ui/static/vendor/swagger-ui/swagger-ui-bundle.js",
        swagger_css_url="/ui/static/vendor/swagger-ui/swagger-ui.css",
        swagger_favicon_url="data:,",
    )
