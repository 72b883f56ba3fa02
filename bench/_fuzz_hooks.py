"""Schemathesis hooks for bench/fuzz.py: send generated msgpack bodies as the bytes they are, and
give every path parameter a real object's id as its example (``FLEETLENS_FUZZ_IDS``, written by
fuzz.py after it seeded the server), so that generated requests reach the code behind the 404s."""

from __future__ import annotations

import json
import os
from typing import Any

import schemathesis


@schemathesis.serializer("application/msgpack")
def msgpack_bytes(ctx: Any, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode()


@schemathesis.hook
def before_load_schema(ctx: Any, raw_schema: dict[str, Any]) -> None:
    ids: dict[str, Any] = json.loads(os.environ.get("FLEETLENS_FUZZ_IDS", "{}"))
    for ops in raw_schema.get("paths", {}).values():
        for op in ops.values():
            if not isinstance(op, dict):
                continue
            for param in op.get("parameters", []):
                if param.get("in") == "path" and param.get("name") in ids:
                    value = ids[param["name"]]
                    param["example"] = value
                    param.setdefault("schema", {})["examples"] = [value]
