"""The wire decoder refuses malformed batches whole and bad rows alone, naming the field, and
reads good ones exactly."""

from __future__ import annotations

import gzip
import json

import msgspec
import numpy as np
import pytest

from fleetlens.collector.decode import DecodeLimits, StringColumn, decode_batch
from fleetlens.errors import BatchTooLarge, UnsupportedVersion, WireError
from fleetlens.wire import TableBuilder, encode_batch

pytestmark = pytest.mark.unit

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
        (  # every row bad: the batch is refused, naming the first
            lambda b: b["tables"]["step"]["cols"].update(rank=[-1, -2]),
            "tables.step.cols.rank",
            "record 0 is -1; ranks are >= 0",
        ),
        (
            lambda b: b["tables"]["step"]["cols"].update(duration=[-0.5, -1.0]),
            "tables.step.cols.duration",
            "durations",
        ),
        (
            lambda b: b["ctx"].update(run_id="team/run-1"),
            "ctx.run_id",
            "no '/'",
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


def _raw(tables: dict[str, object], **batch: object) -> bytes:
    raw = msgspec.msgpack.decode(encode_batch(tables, CTX)[1])  # type: ignore[arg-type]
    raw.update(batch)
    return msgspec.msgpack.encode(raw)


def test_a_bad_row_is_refused_alone_and_counted_by_field() -> None:
    # The probe: run.log(-1, loss=1.0) among 5,271 good scalars refused all of them.
    n = 5272
    tb = TableBuilder("scalar")
    tb.add("step", [-1, *range(n - 1)]).add("time", [1.7e9] * n)
    tb.add("name", ["loss"] * n).add("value", [1.0] * n)
    batch = decode_batch(encode_batch({"scalar": tb.build()}, CTX)[1])
    rows, cols = batch.tables["scalar"]
    assert rows == n - 1 and cols["step"].tolist()[:2] == [0, 1]  # type: ignore[union-attr]
    assert batch.rejected == {"tables.scalar.cols.step": 1}
    assert "record 0 is -1" in batch.errors[0]


def test_a_huge_event_message_does_not_take_the_steps_with_it() -> None:
    ev = TableBuilder("event")
    ev.add("time", [1.7e9, 1.7e9]).add("kind", ["custom", "custom"])
    ev.add("message", ["x" * 70_000, "fine"])
    batch = decode_batch(encode_batch({"event": ev.build(), **_steps(426)}, CTX)[1])  # type: ignore[dict-item]
    assert batch.tables["step"][0] == 426 and batch.tables["event"][0] == 1
    assert batch.rejected == {"tables.event.cols.message": 1}
    assert "(70000 characters)" in batch.errors[0]


@pytest.mark.parametrize(
    ("attrs", "words"),
    [
        ({"step": "abc"}, 'attrs.step is "abc"; expected an integer'),
        ({"size_bytes": 2**70}, "attrs.size_bytes"),
        ({"duration_s": "slow"}, "attrs.duration_s"),
    ],
)
def test_checkpoint_attrs_the_ingest_path_reads_are_validated(attrs, words) -> None:  # type: ignore[no-untyped-def]
    ev = TableBuilder("event")
    ev.add("time", [1.7e9, 1.7e9]).add("kind", ["checkpoint_end", "checkpoint_end"])
    ev.add("attrs", [json.dumps(attrs), json.dumps({"step": 5, "size_bytes": 10})])
    batch = decode_batch(encode_batch({"event": ev.build()}, CTX)[1])
    assert batch.tables["event"][0] == 1
    assert batch.rejected == {"tables.event.cols.attrs": 1} and words in batch.errors[0]
    ev = TableBuilder("event")  # alone in its batch: the batch is refused, a 400
    ev.add("time", [1.7e9]).add("kind", ["checkpoint_end"]).add("attrs", [json.dumps(attrs)])
    with pytest.raises(WireError, match="attrs") as info:
        decode_batch(encode_batch({"event": ev.build()}, CTX)[1])
    assert info.value.field == "tables.event.cols.attrs"


def test_job_start_code_must_be_an_object_or_a_string() -> None:
    ev = TableBuilder("event")
    ev.add("time", [1.7e9]).add("kind", ["job_start"]).add("attrs", ['{"code": 12345}'])
    with pytest.raises(
        WireError, match=r"attrs\.code is 12345; expected a JSON object or a string"
    ):
        decode_batch(encode_batch({"event": ev.build()}, CTX)[1])


def test_ranks_are_bounded_by_the_server_and_the_declared_world() -> None:
    tb = TableBuilder("step")
    tb.add("step", [1, 1, 1]).add("rank", [0, 2147483647, 16_000_000])
    tb.add("time", [1.7e9] * 3).add("duration", [0.5] * 3)
    batch = decode_batch(encode_batch({"step": tb.build()}, CTX)[1])
    assert batch.tables["step"][0] == 1
    assert batch.rejected == {"tables.step.cols.rank": 2}
    assert "collector.max_world_size" in batch.errors[0]
    pl = TableBuilder("placement")  # WORLD_SIZE=16000000 from an SDK
    pl.add("time", [1.7e9]).add("rank", [0]).add("world_size", [16_000_000]).add("node_id", ["n"])
    with pytest.raises(WireError, match="world sizes") as info:
        decode_batch(encode_batch({"placement": pl.build()}, CTX)[1])
    assert info.value.field == "tables.placement.cols.world_size"
    # A job that declared 4 ranks: rank 9 of it is refused, in this batch or a later one.
    tb = TableBuilder("step")
    tb.add("step", [1, 1]).add("rank", [3, 9]).add("time", [1.7e9] * 2).add("duration", [0.5] * 2)
    later = decode_batch(encode_batch({"step": tb.build()}, CTX)[1], declared_world=lambda c: 4)
    assert later.tables["step"][0] == 1 and "declared a world size of 4" in later.errors[0]
    pl = TableBuilder("placement")
    pl.add("time", [1.7e9]).add("rank", [0]).add("world_size", [4]).add("node_id", ["n"])
    same = decode_batch(encode_batch({"placement": pl.build(), "step": tb.build()}, CTX)[1])
    assert same.rejected == {"tables.step.cols.rank": 1}


def test_scalar_names_with_control_characters_are_refused() -> None:
    tb = TableBuilder("scalar")
    tb.add("step", [1, 1, 1, 1]).add("time", [1.7e9] * 4).add("value", [1.0] * 4)
    tb.add("name", ["bad\tname", "bad\nname", "train/loss", ""])
    batch = decode_batch(encode_batch({"scalar": tb.build()}, CTX)[1])
    _, cols = batch.tables["scalar"]
    assert cols["name"].values() == ["train/loss"]  # type: ignore[union-attr]
    assert batch.rejected == {"tables.scalar.cols.name": 3}


def test_content_digest_tells_a_retry_from_another_batch() -> None:
    _, a = encode_batch(_steps(3), CTX, batch_id="same")  # type: ignore[arg-type]
    _, again = encode_batch(_steps(3), CTX, batch_id="same")  # type: ignore[arg-type]
    _, other = encode_batch(_steps(4), CTX, batch_id="same")  # type: ignore[arg-type]
    assert a != again  # sent_at differs: a re-encoded retry is still the same content
    da, dr, do = (decode_batch(b).digests["step"] for b in (a, again, other))
    assert da == dr and da != do


def test_clock_skew_is_corrected_when_certain_and_flagged_otherwise() -> None:
    now = 1.8e9
    year = 365 * 86400.0
    tb = TableBuilder("step")
    tb.add("step", [1]).add("rank", [0]).add("time", [now + year]).add("duration", [0.5])
    ahead = decode_batch(_raw({"step": tb.build()}, sent_at=now + year + 1), now=now)
    assert ahead.shift_s == pytest.approx(-year - 1)
    assert ahead.tables["step"][1]["time"][0] == pytest.approx(now - 1)  # type: ignore[index]
    # A year ahead with no sent_at to correct by: refused as too far in the future.
    with pytest.raises(WireError, match="ahead of the server's clock"):
        decode_batch(_raw({"step": tb.build()}, sent_at=0.0), now=now)
    # Two hours behind: from sent_at alone it may be a replayed batch, so flagged, not moved...
    tb = TableBuilder("step")
    tb.add("step", [1]).add("rank", [0]).add("time", [now - 7200]).add("duration", [0.5])
    behind = decode_batch(_raw({"step": tb.build()}, sent_at=now - 7199), now=now)
    assert behind.skew_s == pytest.approx(7199) and behind.shift_s == 0.0
    # ...and corrected when the sender stamps the time of this attempt.
    sure = decode_batch(
        _raw({"step": tb.build()}, sent_at=now - 7199), now=now, transmitted_at=now - 7199
    )
    assert sure.tables["step"][1]["time"][0] == pytest.approx(now - 1)  # type: ignore[index]


def test_a_gzip_bomb_costs_at_most_the_decoded_limit() -> None:
    import tracemalloc

    bomb = gzip.compress(b"\x00" * (64 << 20), compresslevel=9)
    limits = DecodeLimits(max_decoded_bytes=2 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(BatchTooLarge, match="decompressed body is over"):
            decode_batch(bomb, content_encoding="gzip", limits=limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


def test_infinite_and_absurd_step_and_phase_times_are_refused_by_name() -> None:
    """+inf or 1e300 s in a step's duration or a phase (a timer gone wrong) would make a
    run's wall time and goodput absurd: those rows are refused, each counted under its field;
    a NaN phase (not measured) and the good rows are kept."""
    tb = TableBuilder("step")
    tb.add("step", [0, 1, 2, 3, 4, 5]).add("rank", [0] * 6).add("time", [1.7e9] * 6)
    tb.add("duration", [0.5, float("inf"), 1e300, 0.5, 0.5, 0.5])
    tb.add("forward", [0.1, 0.1, 0.1, float("inf"), 0.1, float("nan")])
    tb.add("backward", [0.2, 0.2, 0.2, 0.2, 1e300, 0.2])
    batch = decode_batch(encode_batch({"step": tb.build()}, CTX)[1])
    rows, cols = batch.tables["step"]
    assert rows == 2 and cols["step"].tolist() == [0, 5], batch.errors  # type: ignore[union-attr]
    assert batch.rejected == {
        "tables.step.cols.duration": 2,
        "tables.step.cols.forward": 1,
        "tables.step.cols.backward": 1,
    }, batch.rejected
    assert any("durations are finite, 0..2.592e+06 s" in e for e in batch.errors), batch.errors


def test_an_infinite_time_is_refused_even_with_no_bound_on_the_future() -> None:
    # collector.max_future_s may be inf (no bound on how far ahead a sender's clock is); a
    # time of +inf is still not a time.
    tb = TableBuilder("step")
    tb.add("step", [0, 1, 2]).add("rank", [0, 0, 0])
    tb.add("time", [1.7e9, float("inf"), 1.7e9 + 1]).add("duration", [0.5, 0.5, 0.5])
    _, body = encode_batch({"step": tb.build()}, CTX)
    for limits in (DecodeLimits(max_future_s=float("inf")), DecodeLimits()):
        batch = decode_batch(body, limits=limits, now=1.7e9)
        n, cols = batch.tables["step"]
        assert n == 2 and cols["step"].tolist() == [0, 2], (limits, batch.errors)  # type: ignore[union-attr]
        assert batch.rejected == {"tables.step.cols.time": 1}, batch.rejected
