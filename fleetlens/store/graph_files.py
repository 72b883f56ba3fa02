"""Files of the run graph, reached through fsspec (local paths, ``file://``, ``s3://``, ...):
their sha256 when registered, and the check that a pointer still reaches what was registered."""

from __future__ import annotations

import hashlib
import os
import stat
import urllib.parse
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError

__all__ = ["REMOTE_SCHEMES", "bare", "server_read_refusal", "sha256_of", "verify"]

_CHUNK = 8 << 20
REMOTE_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})
_LOCAL_SCHEMES = frozenset({"", "file", "local"})
# A checksum reads the whole object; past these the server refuses instead of reading.
MAX_CHECKSUM_BYTES = 64 << 30


def server_read_refusal(uri: str, roots: Sequence[str]) -> str | None:
    """Why the server may not read ``uri`` to checksum it, or None when it may.

    Local files (bare paths, ``file:``, ``local:``) only under ``roots`` (DATA/artifacts and the
    configured ``readable_paths``: ``ServerConfig.readable_roots``), after symlinks are
    resolved, and only regular files (no FIFO or device: ``/dev/zero`` never ends) of at most
    MAX_CHECKSUM_BYTES; remote objects only in REMOTE_SCHEMES; no chained URLs.
    """
    if "::" in uri:
        return "chained fsspec URLs (`::`) are not read by the server"
    if "\0" in uri:
        return "the URI contains a NUL character"
    parts = urllib.parse.urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in REMOTE_SCHEMES:
        return None
    if scheme not in _LOCAL_SCHEMES:
        return (
            f"the server reads only local files under its readable paths and objects in "
            f"{', '.join(sorted(REMOTE_SCHEMES))}, not {scheme}: URIs"
        )
    if scheme and parts.netloc not in ("", "localhost"):
        return f"{uri!r} names another host"
    raw = urllib.parse.unquote(parts.path) if scheme else uri
    path = os.path.realpath(raw)
    if not any(path.startswith(os.path.realpath(r) + os.sep) for r in roots):
        return (
            "the server reads local files only under DATA/artifacts and the directories of "
            "its readable_paths setting (FLEETLENS_READABLE_PATHS)"
        )
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"cannot read {uri!r}: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"{uri!r} is not a regular file"
    if st.st_size > MAX_CHECKSUM_BYTES:
        return f"{uri!r} is {st.st_size} bytes; the server checksums at most {MAX_CHECKSUM_BYTES}"
    return None


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
        checks.append(
            {"what": what, "uri": uri, "ok": ok, "expected": bare(expected), "actual": digest}
        )

    check("checkpoint", ck.get("uri", ""), ck.get("checksum", ""))
    for shard in (dataset or {}).get("shards", []) or []:
        check("dataset shard", str(shard.get("uri", "")), str(shard.get("sha256", "")))
    known = [c["ok"] for c in checks if c["ok"] is not None]
    return {"ok": bool(known) and all(known), "checks": checks}
