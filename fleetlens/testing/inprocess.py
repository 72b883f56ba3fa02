"""The whole server in this process, driven through ASGI: the API tier of the tests.

The same app ``fleetlens serve`` runs (routes, portal, middleware, background passes, lifespan),
without a socket or a process: a request costs a function call, so a test of what a route answers
runs in milliseconds and cannot depend on a port, a start-up race or the machine's pace. What a
socket or a process adds (the SDK's sender, signals, restarts) is the process tier's to test.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any


@dataclass
class InProcessServer:
    """``create_app`` under Starlette's test client, with the request methods of ``Server``."""

    data_dir: str
    env: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  # as `fleetlens serve` flags give them
    _client: Any = None

    def start(self) -> InProcessServer:
        from fastapi.testclient import TestClient

        from ..config import ServerConfig
        from ..server import create_app

        os.makedirs(self.data_dir, exist_ok=True)
        config = ServerConfig.resolve(
            {"data_dir": self.data_dir, "host": "127.0.0.1", **self.settings},
            environ={**os.environ, **self.env},
        )
        client = TestClient(create_app(config), raise_server_exceptions=False)  # a 500, as served
        client.__enter__()  # runs the lifespan: the stores open, the background passes start
        self._client = client
        return self

    def stop(self) -> None:
        if self._client is not None:
            self._client.__exit__(None, None, None)
            self._client = None

    def __enter__(self) -> InProcessServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _headers(self, token: str | None, **extra: str) -> dict[str, str]:
        return {**({"Authorization": f"Bearer {token}"} if token else {}), **extra}

    def get(self, path: str, token: str | None = None) -> Any:
        """The decoded JSON answer; an error status raises, as ``Server.get`` does."""
        r = self._client.get(path, headers=self._headers(token))
        r.raise_for_status()
        return r.json()

    def request(
        self, method: str, path: str, body: Any = None, token: str | None = None
    ) -> tuple[int, Any]:
        """Any request; returns (status, decoded JSON or text) and never raises on 4xx/5xx."""
        headers = self._headers(token)
        content = None
        if body is not None:
            content = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        r = self._client.request(method, path, content=content, headers=headers)
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, r.text

    def post(
        self,
        body: bytes,
        content_type: str = "application/msgpack",
        encoding: str = "",
        token: str | None = None,
        path: str = "/v1/ingest",
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """A raw body (a wire batch by default), as ``Server.post`` sends it."""
        headers = self._headers(token, **{"Content-Type": content_type})
        if encoding:
            headers["Content-Encoding"] = encoding
        r = self._client.post(path, content=body, headers=headers)
        return r.status_code, (r.json() if r.content else {}), dict(r.headers)

    def put(
        self, path: str, content: bytes, content_type: str, token: str | None = None
    ) -> tuple[int, Any]:
        """A raw body PUT (a trace file); (status, decoded JSON or text)."""
        r = self._client.put(
            path, content=content, headers=self._headers(token, **{"Content-Type": content_type})
        )
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, r.text
