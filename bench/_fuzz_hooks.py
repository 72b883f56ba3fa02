"""Schemathesis hooks for bench/fuzz.py: send generated msgpack bodies as the bytes they are."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.serializer("application/msgpack")
def msgpack_bytes(ctx: Any, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode()
