"""The shared harness's server (``fleetlens.testing.Server``) on a port another process took
between choosing it and binding it (several test workers start servers at once): a first start
moves to a new port instead of failing the test; a restart keeps its port and says why not."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fleetlens.testing import Server

pytestmark = pytest.mark.e2e


def test_a_first_start_on_a_taken_port_moves_to_another(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        server = Server(str(tmp_path / "data"), port=taken).start()
        try:
            assert server.port != taken and server.get("/healthz")["status"] == "ok"
            server.stop()
            # A restart keeps its port: taken now, it fails, naming the cause.
            server.port = taken
            with pytest.raises(RuntimeError, match="address already in use"):
                server.start()
        finally:
            server.stop()
