"""Every request bounded, on every route: body size, decoded size across a relay's frames, and
the time its headers and body may take (issue 38). A real ``fleetlens serve`` on loopback with
small limits, so that each probe is cheap; the server's own memory is read from ``/proc``."""

from __future__ import annotations

import http.client
import socket
import time
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from fleetlens.testing import Server, step_batch
from fleetlens.wire import (
    BATCHES_CONTENT_TYPE,
    BatchFrame,
    TableBuilder,
    encode_batch,
    encode_frames,
)

pytestmark = pytest.mark.e2e

_DECODED = 32 << 20


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(
        str(tmp_path_factory.mktemp("limits")),
        env={
            "FLEETLENS_MAX_DECODED_BYTES": str(_DECODED),
            "FLEETLENS_BODY_GRACE_S": "2",
            "FLEETLENS_HEADER_TIMEOUT_S": "2",
        },
    ).start()
    yield server
    server.stop()


def _rss_kb(server: Server, field: str = "VmRSS:") -> int:
    assert server.proc is not None
    with open(f"/proc/{server.proc.pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(field))


def _post_json(server: Server, path: str, body: bytes, chunked: bool = False) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        if chunked:
            pieces = (body[i : i + (1 << 20)] for i in range(0, len(body), 1 << 20))
            conn.request(
                "POST", path, pieces, {"Content-Type": "application/json"}, encode_chunked=True
            )
        else:
            conn.request("POST", path, body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    except (BrokenPipeError, ConnectionResetError) as exc:  # answered before the body was sent
        return -1, str(exc)
    finally:
        conn.close()


def test_a_json_body_over_the_limit_is_refused_at_the_door_naming_it(small: Server) -> None:
    assert small.post(step_batch("limits", range(0, 2), 2)[1])[0] == 200
    before = _rss_kb(small)
    huge = b'{"config": {"pad": "' + b"x" * (48 << 20) + b'"}}'
    status, answer = _post_json(small, "/v1/runs/limits/describe", huge)
    assert status == 413 and "16777216" in answer, (status, answer[:200])
    # Chunked, so its size is known only as it arrives: refused as soon as it passes the limit.
    status, answer = _post_json(small, "/v1/runs/limits/describe", huge, chunked=True)
    assert status in (413, -1), (status, answer[:200])
    if status == 413:
        assert "16777216" in answer
    grew_mb = (_rss_kb(small) - before) / 1024
    assert grew_mb < 40, grew_mb  # nothing of the 48 MiB bodies kept (three at once held 4.3 GB)
    # A body within the limit is read and answered as before.
    status, _ = _post_json(small, "/v1/runs/limits/describe", b'{"config": {"lr": 0.1}}')
    assert status == 200
    assert small.get("/v1/runs/limits")["config"]["lr"] == 0.1


def _bomb(expanded_mb: int) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\x00" * (16 << 20)
    return b"".join(z.compress(chunk) for _ in range(expanded_mb // 16)) + z.flush()


def test_a_relay_envelope_of_bombs_costs_one_frame_not_the_sum(small: Server) -> None:
    bomb = _bomb(256)
    frames = [BatchFrame(body=bomb, encoding="gzip") for _ in range(10)]
    before = _rss_kb(small)
    status, answer, _ = small.post(
        encode_frames(frames), BATCHES_CONTENT_TYPE, path="/v1/ingest/batches"
    )
    assert status == 200
    assert [r["status"] for r in answer["results"]] == [413] * 10
    grew_mb = (_rss_kb(small) - before) / 1024
    # Each refusal kept its traceback, and with it the 32 MiB decoded so far: 10 x 32 MiB held.
    assert grew_mb < 3 * _DECODED / (1 << 20), grew_mb


def _wide(run: str, rows: int) -> bytes:
    """A valid batch whose columns decode to ``rows * 28`` bytes."""
    tb = TableBuilder("step")
    tb.add_packed("step", np.arange(rows, dtype="<i8").tobytes())
    tb.add_packed("rank", np.zeros(rows, dtype="<i4").tobytes())
    tb.add_packed("time", np.full(rows, time.time() - 60, dtype="<f8").tobytes())
    tb.add_packed("duration", np.full(rows, 0.5, dtype="<f8").tobytes())
    return encode_batch({"step": tb.build()}, {"run_id": run}, compress=True)[1]


def test_frames_past_the_decoded_budget_are_sent_again_not_held(small: Server) -> None:
    # Three frames of 14 MB decoded each against a 32 MiB budget: two fit, the third is
    # "send again" (429) and is not decoded; sent again alone, it is stored.
    frames = [BatchFrame(body=_wide(f"budget-{i}", 500_000), encoding="gzip") for i in range(3)]
    status, answer, _ = small.post(
        encode_frames(frames), BATCHES_CONTENT_TYPE, path="/v1/ingest/batches"
    )
    assert status == 200
    assert [r["status"] for r in answer["results"]] == [200, 200, 429], answer
    assert "decoded bytes" in answer["results"][2]["error"]
    status, again, _ = small.post(
        encode_frames(frames[2:]), BATCHES_CONTENT_TYPE, path="/v1/ingest/batches"
    )
    assert [r["status"] for r in again["results"]] == [200]
    assert small.get("/v1/runs/budget-2")["steps"] == 500_000


def _trickle(server: Server, head: bytes, drip: bytes) -> bytes:
    """Send ``head`` then ``drip`` a byte every 0.2 s; what the server answered before the drip
    ran out (b"" if it closed without a word, or never answered)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head)
        sock.settimeout(0.2)
        for byte in drip:
            try:
                sock.sendall(bytes([byte]))
                first = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return b""
            return first + _rest(sock) if first else b""
    return b""


def _rest(sock: socket.socket) -> bytes:
    """The rest of an answer whose first bytes came: until the server closes (its answers here
    say ``connection: close``), however many reads the headers and the body take."""
    sock.settimeout(10)
    out = b""
    try:
        while chunk := sock.recv(4096):
            out += chunk
    except OSError:
        pass
    return out


def test_headers_and_bodies_sent_a_byte_at_a_time_are_cut_off(small: Server) -> None:
    # Headers that never end: 408 and the connection closed (they were held forever).
    answer = _trickle(small, b"GET /v1/runs HTTP/1.1\r\nHost: x\r\n", b"X-Pad: " + b"a" * 200)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    # A JSON body that never ends, on a route the API reads for the handler: 408.
    head = (
        b"POST /v1/runs/limits/describe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
        b"\r\nContent-Length: 500\r\n\r\n"
    )
    answer = _trickle(small, head, b'{"config": {"pad": "' + b"a" * 400)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"did not arrive in time" in answer
    # Meanwhile and after, an ordinary client is served.
    assert small.get("/healthz")["status"] == "ok"


def test_the_openapi_document_names_the_routes_that_read_their_own_body(small: Server) -> None:
    doc = small.get("/openapi.json")
    own = sorted(
        f"{m.upper()} {p}"
        for p, ops in doc["paths"].items()
        for m, op in ops.items()
        if op.get("x-fleetlens-own-body")
    )
    assert own == [
        "POST /v1/ingest",
        "POST /v1/ingest/batches",
        "POST /v1/runs/{run_id}/flight-recorder",
        "POST /v1/scheduler/import",
        "PUT /v1/runs/{run_id}/traces/captures/{capture_id}/{rank}",
        "PUT /v1/runs/{run_id}/traces/files/{rank}",
    ]
