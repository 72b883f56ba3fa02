"""Checkpoints with telemetry, and verified ones: hashed, fsynced, read back, with a manifest.

``save_verified`` writes ``ckpt-<step>.pt`` and, only once the file reads back with the hash it
was written with, its manifest ``ckpt-<step>.json`` (step, path, sha256, bytes);
``latest_checkpoint`` returns the newest one whose file still matches its manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import time
from typing import Any

import torch

from ..sdk.run import Run

__all__ = ["latest_checkpoint", "load", "save", "save_verified"]


def save(run: Run, obj: Any, path: str, step: int, **attrs: Any) -> None:
    """``torch.save`` as a checkpoint: begin and end events with size and duration."""
    with run.checkpoint(step, path=path, sync=True, **attrs) as ck:
        torch.save(obj, path)
        with contextlib.suppress(OSError, AttributeError):  # a disabled run's span has no attrs
            ck.attrs["size_bytes"] = os.path.getsize(path)


def load(run: Run, path: str, step: int | None = None, **kwargs: Any) -> Any:
    """``torch.load`` with a checkpoint_load event (path, size, duration)."""
    t0 = time.perf_counter()
    obj = torch.load(path, **kwargs)
    with contextlib.suppress(Exception):  # telemetry never breaks the caller
        run.event(
            "checkpoint_load",
            step=step,
            message=path,
            path=path,
            duration_s=time.perf_counter() - t0,
            size_bytes=os.path.getsize(path),
        )
    return obj


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_verified(
    run: Run, obj: Any, directory: str, step: int, *, remediation: int = 0
) -> dict[str, Any]:
    """A synchronous checkpoint that is verified before anyone relies on it.

    The state is serialized in memory and hashed, written to a temporary file, flushed to disk
    and renamed; the file is then read back and hashed again. Only when both hashes match is the
    manifest (``ckpt-<step>.json``: step, path, sha256, bytes) written, atomically, next to it:
    a checkpoint without a manifest is never resumed from. ``step`` is the first step to run
    after loading it. Raises if verification fails."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"ckpt-{step:08d}.pt")
    attrs: dict[str, Any] = (
        {"category": "recovery", "remediation": remediation} if remediation else {}
    )
    with run.checkpoint(step, path=path, sync=True, **attrs) as ck:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = buf.getvalue()
        digest = hashlib.sha256(data).hexdigest()
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        readback = _sha256(path)
        if readback != digest:
            raise OSError(f"checkpoint {path} reads back as {readback}, wrote {digest}")
        manifest = {
            "step": step,
            "path": path,
            "sha256": digest,
            "bytes": len(data),
            "time": time.time(),
            "remediation": remediation,
        }
        mtmp = os.path.join(directory, f".ckpt-{step:08d}.json.tmp-{os.getpid()}")
        with open(mtmp, "w") as fh:
            json.dump(manifest, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(mtmp, os.path.join(directory, f"ckpt-{step:08d}.json"))
        if isinstance(getattr(ck, "attrs", None), dict):  # a disabled run's span has none
            ck.attrs.update(size_bytes=len(data), sha256=digest, verified=True)
    return manifest


def latest_checkpoint(directory: str) -> tuple[dict[str, Any], str] | None:
    """The newest checkpoint in ``directory`` whose file matches its manifest's checksum."""
    try:
        names = sorted(
            (n for n in os.listdir(directory) if n.startswith("ckpt-") and n.endswith(".json")),
            reverse=True,
        )
    except OSError:
        return None
    for name in names:
        try:
            with open(os.path.join(directory, name)) as fh:
                manifest = json.load(fh)
            path = os.path.join(directory, os.path.basename(str(manifest["path"])))
            if _sha256(path) == manifest["sha256"]:
                return manifest, path
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None
