"""Files of the run graph, reached through fsspec (local paths, ``file://``, ``s3://``, ...):
their sha256 when registered, and the check that a pointer still reaches what was registered."""

from __future__ import annotations

import hashlib
from typing import Any

from ..errors import ConfigError

__all__ = ["bare", "sha256_of", "verify"]

_CHUNK = 8 << 20


def sha256_of(uri: str) -> tuple[str, int]:
    """(hex sha256, size in bytes) of the file ``uri`` reaches through fsspec."""
    import fsspec  # type: ignore[import-untyped]

    h = hashlib.sha256()
    size = 0
    try:
        with fsspec.open(uri, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigError(f"cannot read {uri!r} to checksum it: {exc}") from exc
    return h.hexdigest(), size


def bare(checksum: str) -> str:
    """The hex digest of ``sha256:HEX`` or of ``HEX``."""
    return checksum.split(":", 1)[1] if checksum.startswith("sha256:") else checksum


def verify(ck: dict[str, Any], dataset: dict[str, Any] | None) -> dict[str, Any]:
    """Re-read a checkpoint and a dataset's shards and compare them with their stored sha256."""
    checks: list[dict[str, Any]] = []

    def check(what: str, uri: str, expected: str) -> None:
        if not uri or not expected:
            checks.append({"what": what, "uri": uri, "ok": None, "reason": "no checksum stored"})
            return
        try:
            digest, _ = sha256_of(uri)
        except ConfigError as exc:
            checks.append({"what": what, "uri": uri, "ok": False, "reason": str(exc)})
            return
        ok = digest == bare(expected)
        checks.append({"what": what, "uri": uri, "ok": ok, "expected": bare(expected),
                       "actual": digest})  # fmt: skip

    check("checkpoint", ck.get("uri", ""), ck.get("checksum", ""))
    for shard in (dataset or {}).get("shards", []) or []:
        check("dataset shard", str(shard.get("uri", "")), str(shard.get("sha256", "")))
    known = [c["ok"] for c in checks if c["ok"] is not None]
    return {"ok": bool(known) and all(known), "checks": checks}
