"""The ingest fast path is in front of the app's middleware stack (``api.ingest.IngestApp``), so
it answers for itself what the stack did for it: ``nosniff`` on every answer, and an unexpected
error as a logged JSON 500 with nothing stored, the server still serving."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest

from fleetlens.errors import WireError
from fleetlens.testing import InProcessServer, step_batch

pytestmark = pytest.mark.api


def test_ingest_answers_carry_nosniff_and_an_unexpected_error_is_a_logged_500(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with InProcessServer(str(tmp_path / "data")) as srv:
        status, answer, headers = srv.post(step_batch("front", range(0, 3), 2)[1])
        assert status == 200 and answer["rows"] == {"step": 6}, answer
        assert headers["x-content-type-options"] == "nosniff"
        status, _, headers = srv.post(b"not a batch")
        assert status == 400 and headers["x-content-type-options"] == "nosniff"

        ingestor: Any = srv._client.app.state.services.ingestor
        real = ingestor.prepare

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a bug in the ingest path")

        ingestor.prepare = broken
        try:
            status, answer, headers = srv.post(step_batch("front-2", range(0, 3), 2)[1])
        finally:
            ingestor.prepare = real
        assert status == 500 and "not stored" in answer["error"], answer
        assert headers["x-content-type-options"] == "nosniff"
        assert any("ingest request failed" in r.message for r in caplog.records)
        assert srv.request("GET", "/v1/runs/front-2")[0] == 404
        assert srv.post(step_batch("front-2", range(0, 3), 2)[1])[0] == 200  # still serving
        assert srv.get("/v1/runs/front-2")["lastStep"] == 2


def test_a_refused_batch_is_freed_as_its_request_ends_not_by_the_collector(
    tmp_path: Path,
) -> None:
    # What a refused batch held (its body, the frames' decompressed bytes) goes when its request
    # has its answer, by reference counting: an error handed over with its frames held the
    # request's future, a cycle only the garbage collector would free, gigabytes of bombs later.
    class Held:
        pass

    held: list[weakref.ref[Held]] = []

    def refusing(exc: Exception) -> Any:
        def make() -> Any:
            data = Held()
            held.append(weakref.ref(data))
            raise exc

        return make

    with InProcessServer(str(tmp_path / "data")) as srv:
        ingestor: Any = srv._client.app.state.services.ingestor
        gc.disable()
        try:
            for exc in (WireError("tables.step is bad", "tables.step"), RuntimeError("a bug")):
                answer = ingestor.accept(refusing(exc))
                got = answer.exception(timeout=30)
                assert got is exc
                if isinstance(got, RuntimeError):  # where it was raised stays, for the log
                    assert "raised on the ingest pool" in "".join(got.__notes__)
                    assert "in make" in "".join(got.__notes__)
                del answer, got
                assert held[-1]() is None, "what the refused batch held is still alive"
        finally:
            gc.enable()
