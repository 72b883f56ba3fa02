"""The wire decoder refuses bad batches whole, naming the field, and reads good ones exactly."""

from __future__ import annotations

import gzip
import json

import msgspec
import numpy as np
import pytest

from fleetlens.collector.decode import DecodeLimits, StringColumn, decode_batch
from fleetlens.errors import BatchTooLarge, UnsupportedVersion, WireError
from fleetlens.wire import TableBuilder, encode_batch

CTX = {"run_id": "r1", "job_id": "j1"}


def _steps(n: int = 3) -> dict[str, object]:
    tb = TableBuilder("step")
    tb.add("step", list(range(n))).add("rank", [0] * n).add("time", [1.7e9] * n)
    tb.add("duration", [0.5] * n)
    return {"step": tb.build()}


def test_packed_columns_roundtrip_exactly() -> None:
    tb = TableBuilder("scalar")
    tb.add("step", [1, 2]).add("time", [1.7e9, 1.7e9 + 1]).add("name", ["loss", "lr"])
    tb.add("value", [float("nan"), 3e-4])
    bid, body = encode_batch({"scalar": tb.build()}, CTX, compress=True)
    batch = decode_batch(body, content_encoding="gzip")
    n, cols = batch.tables["scalar"]
    assert batch.batch_id == bid and n == 2 and batch.ctx == CTX
    assert cols["step"].tolist() == [1, 2]  # type: ignore[union-attr]
    name = cols["name"]
    assert isinstance(name, StringColumn) and name.values() == ["loss", "lr"]
    value = cols["value"]
    assert isinstance(value, np.ndarray) and np.isnan(value[0]) and value[1] == 3e-4


def test_json_batches_are_accepted_for_people_and_curl() -> None:
    body = json.dumps(
        {
            "v": 1,
            "batch_id": "b-1",
            "ctx": CTX,
            "tables": {"event": {"n": 1, "cols": {"time": [1.7e9], "kind": ["finish"]}}},
        }
    ).encode()
    batch = decode_batch(body, "application/json")
    assert batch.rows == 1


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (lambda b: b.update(v=2), "v", "wire version 2"),
        (lambda b: b.update(batch_id=""), "batch_id", "batch_id"),
        (lambda b: b["ctx"].pop("run_id"), "ctx.run_id", "need ctx.run_id"),
        (lambda b: b["ctx"].update(color="red"), "ctx", "'color'"),
        (lambda b: b["tables"].update(nope={"n": 0, "cols": {}}), "tables.nope", "not known"),
        (
            lambda b: b["tables"]["step"]["cols"].pop("duration"),
            "tables.step.cols.duration",
            "missing required column 'duration'",
        ),
        (
            lambda b: b["tables"]["step"]["cols"].update(rank=[0, -1]),
            "tables.step.cols.rank",
            "record 1 is -1; ranks are >= 0",
        ),
        (
            lambda b: b["tables"]["step"]["cols"].update(duration=[0.5, -1.0]),
            "tables.step.cols.duration",
            "durations",
        ),
        (
            lambda b: b["tables"]["step"]["cols"].update(step=[1]),
            "tables.step.cols.step",
            "1 values; n is 2",
        ),
        (
            lambda b: b["tables"]["step"]["cols"].update(step=[1, "x"]),
            "tables.step.cols.step",
            "expected a number",
        ),
        (
            lambda b: b["tables"]["step"]["cols"].update(bogus=[1, 2]),
            "tables.step.cols.bogus",
            "no column 'bogus'",
        ),
    ],
)
def test_bad_batches_name_the_field(mutate, field, words) -> None:  # type: ignore[no-untyped-def]
    batch = {
        "v": 1,
        "batch_id": "b1",
        "ctx": dict(CTX),
        "tables": {
            "step": {
                "n": 2,
                "cols": {
                    "step": [1, 1],
                    "rank": [0, 1],
                    "time": [1.7e9, 1.7e9],
                    "duration": [0.5, 0.5],
                },
            }
        },
    }
    mutate(batch)
    with pytest.raises(WireError) as info:
        decode_batch(json.dumps(batch).encode(), "application/json")
    assert info.value.field == field
    assert words in str(info.value)


def test_packed_column_of_wrong_length_is_refused() -> None:
    tables = _steps(3)
    tables["step"].cols["rank"] = b"\x00" * 5  # type: ignore[attr-defined]
    _, body = encode_batch(tables, CTX)  # type: ignore[arg-type]
    with pytest.raises(WireError, match="is 5 bytes; 3 values of int32 need 12"):
        decode_batch(body)


def test_truncated_and_garbage_bodies_are_clear_errors() -> None:
    _, body = encode_batch(_steps(), CTX)  # type: ignore[arg-type]
    with pytest.raises(WireError, match="not valid application/msgpack"):
        decode_batch(body[: len(body) // 2])
    with pytest.raises(WireError, match="truncated"):
        decode_batch(gzip.compress(body)[:-12], content_encoding="gzip")
    with pytest.raises(WireError, match="Content-Type"):
        decode_batch(body, "text/plain")
    with pytest.raises(WireError, match="Content-Encoding"):
        decode_batch(body, content_encoding="br")


def test_wrong_version_is_its_own_error() -> None:
    raw = msgspec.msgpack.decode(encode_batch(_steps(), CTX)[1])  # type: ignore[arg-type]
    raw["v"] = 99
    with pytest.raises(UnsupportedVersion, match="version 99 is not supported"):
        decode_batch(msgspec.msgpack.encode(raw))


def test_limits_refuse_oversized_and_zip_bombs() -> None:
    _, body = encode_batch(_steps(10), CTX)  # type: ignore[arg-type]
    with pytest.raises(BatchTooLarge):
        decode_batch(body, limits=DecodeLimits(max_body_bytes=len(body) - 1))
    with pytest.raises(BatchTooLarge, match="rows"):
        decode_batch(body, limits=DecodeLimits(max_rows=5))
    bomb = gzip.compress(b"\x00" * (4 << 20))
    with pytest.raises(BatchTooLarge, match="decompressed"):
        decode_batch(bomb, content_encoding="gzip", limits=DecodeLimits(max_decoded_bytes=1 << 20))


def test_unknown_event_kind_and_bad_attrs_are_refused() -> None:
    tb = TableBuilder("event")
    tb.add("time", [1.7e9]).add("kind", ["explosion"])
    with pytest.raises(WireError, match="'explosion'; known kinds"):
        decode_batch(encode_batch({"event": tb.build()}, CTX)[1])
    tb = TableBuilder("event")
    tb.add("time", [1.7e9]).add("kind", ["nan"]).add("attrs", ["[1,2]"])
    with pytest.raises(WireError, match="JSON object"):
        decode_batch(encode_batch({"event": tb.build()}, CTX)[1])


def test_json_that_is_not_utf8_is_a_clear_error() -> None:
    # Found by bench/fuzz.py: msgspec raised UnicodeDecodeError, which is not a WireError.
    body = b'{"v": 1, "batch_id": "b1\xde\xcb0"}'
    with pytest.raises(WireError, match="not valid application/json"):
        decode_batch(body, "application/json")
