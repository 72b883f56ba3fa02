"""``/runbooks``: every alert rule of the policy in force, what raises it, who hears it and the
first steps to take (:mod:`fleetlens.alerts.runbooks`); each alert's ``runbook_url`` points at
its rule's section (``/runbooks#JobHang``). Rendered on the server: it holds no run's data and
needs no token."""

from __future__ import annotations

import html

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from ..alerts.policy import Rule
from ..alerts.runbooks import RUNBOOKS
from .pages import page

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


def _trigger(r: Rule) -> str:
    if r.signal == "goodput":
        return f"goodput under {r.threshold:.0%} for {r.for_s / 60:g} min"
    if r.signal == "hang":
        return f"no progress for {r.threshold:g} x the recent step time (at least {r.floor_s:g} s)"
    if r.signal == "metric":
        return f"{r.metric} {r.op} {r.threshold:g} for {r.for_s / 60:g} min"
    if r.signal == "evaluation":
        return f"an evaluation regression of kind {', '.join(r.kinds)}"
    return f"a finding: {', '.join(r.diagnoses)}" + (f" ({', '.join(r.kinds)})" if r.kinds else "")


def _section(r: Rule) -> str:
    e = html.escape
    steps = RUNBOOKS.get(r.name, ("No runbook for this rule yet: see its description.",))
    items = "".join(f"<li>{e(s)}</li>" for s in steps)
    own = (
        f'<p>This team\'s runbook: <a href="{e(r.runbook_url, quote=True)}">{e(r.runbook_url)}</a>'
        "</p>"
        if r.runbook_url
        else ""
    )
    return (
        f'<section aria-labelledby="rb-{e(r.name)}"><h2 id="rb-{e(r.name)}"><a id="{e(r.name)}" '
        f'href="#{e(r.name)}">{e(r.name)}</a></h2><p>{e(r.description)}. '
        f"<b>{e(r.severity)}</b> to <b>{e(r.audience)}</b> on {e(_trigger(r))}.</p>{own}"
        f"<ol>{items}</ol></section>"
    )


@router.get("/runbooks", response_class=HTMLResponse)
async def runbooks(request: Request) -> HTMLResponse:
    policy = request.app.state.services.monitor.policy
    body = "".join(_section(r) for r in policy.rules)
    return page(request, "runbooks", "Runbooks", body, script="models.js", public=True)
