"""Several servers on one metadata database: who leads, and what a follower does about it.

The election itself is :mod:`fleetlens.store.leader`. Here: the loop that keeps it going (and
hands the lead to the monitor when this server takes it), the ``fleetlens_leader`` gauge, and
the forwarding of a job's control channel (docs/deployment.md). A job's ranks are positioned
and told what to do by the remediation controller, in the leader's memory, so a follower that
gets a control poll or answer, or a person's approval, passes it to the leader over HTTP and
returns the leader's answer as it came; while no leader is known the answer is 503 with
Retry-After, which the SDK retries.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from prometheus_client.core import GaugeMetricFamily, Metric

from ..store.leader import RETRY_S, Election

if TYPE_CHECKING:
    import httpx

__all__ = [
    "FORWARDED",
    "LeaderClient",
    "LeaderGauge",
    "forward_to_leader",
    "keep_electing",
    "leader_of",
]

log = logging.getLogger("fleetlens.leader")

FORWARDED = "x-fleetlens-forwarded"
"""Set on a request a follower passes on, so it is never passed on twice."""
LEADER_HEADER = "X-Fleetlens-Leader"
"""On a control answer: the URL of the leader that answered it."""

_HOP = ("authorization", "content-type", "user-agent", "x-request-id")


class LeaderClient:
    """The HTTP client a follower forwards with, made at its first forward: a server alone on
    its metadata never forwards, and httpx with what it imports is a tenth of a second of every
    server's start."""

    def __init__(self, timeout: float = 10.0) -> None:
        self.timeout = timeout
        self._client: httpx.AsyncClient | None = None

    def get(self) -> httpx.AsyncClient:
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(timeout=self.timeout)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


class LeaderGauge:
    """``fleetlens_leader``: 1 on the server that leads, 0 on a follower (read at scrape)."""

    def __init__(self, election: Election) -> None:
        self.election = election

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily(
            "fleetlens_leader",
            "1 when this server leads (runs monitoring, alerts and remediation), else 0",
        )
        g.add_metric([], 1.0 if self.election.is_leader else 0.0)
        yield g


async def keep_electing(election: Election, on_gain: Callable[[], None]) -> None:
    """Forever: one election round every ``RETRY_S``; ``on_gain`` (blocking) when the lead
    comes to this server."""
    leading = election.is_leader
    while True:
        await asyncio.sleep(RETRY_S)
        try:
            now = await anyio.to_thread.run_sync(election.check)
        except Exception:  # the election logs its own failures; keep trying
            log.exception("leader election round failed")
            continue
        if now and not leading:
            try:
                await anyio.to_thread.run_sync(on_gain)
            except Exception:
                log.exception("taking over as leader failed")
        leading = now


def leader_of(request: Request) -> Election | None:
    return getattr(request.app.state, "leader", None)


async def forward_to_leader(request: Request) -> Response | None:
    """None when this server leads (answer here); else the leader's answer to this request."""
    election = leader_of(request)
    if election is None or election.is_leader:
        return None
    target = election.leader_url
    if request.headers.get(FORWARDED) or not target:
        why = "is not the leader any more" if target else "knows no leader right now"
        return JSONResponse(
            {"detail": f"this server {why}; retry", "leader": target or None},
            status_code=503,
            headers={"Retry-After": "1"},
        )
    import httpx

    client = request.app.state.leader_client.get()
    url = target + request.url.path + (f"?{request.url.query}" if request.url.query else "")
    headers: dict[str, Any] = {k: v for k, v in request.headers.items() if k in _HOP}
    headers[FORWARDED] = "1"
    try:
        got = await client.request(
            request.method, url, content=await request.body(), headers=headers
        )
    except httpx.HTTPError as exc:
        return JSONResponse(
            {"detail": f"the leader at {target} did not answer ({exc}); retry", "leader": target},
            status_code=503,
            headers={"Retry-After": "1"},
        )
    keep = {k: v for k, v in got.headers.items() if k.lower() in ("retry-after", "allow")}
    keep[LEADER_HEADER] = got.headers.get(LEADER_HEADER, target)
    return Response(
        got.content,
        status_code=got.status_code,
        headers=keep,
        media_type=got.headers.get("content-type"),
    )
