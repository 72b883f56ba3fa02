"""Out-of-memory errors told apart from other exceptions, with what is known about them.

PyTorch raises ``torch.OutOfMemoryError`` for a device ("CUDA out of memory. Tried to allocate
2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.06 GiB is free..."), a plain
``RuntimeError`` from its CPU allocator ("DefaultCPUAllocator: can't allocate memory: you tried to
allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)"), and Python raises
``MemoryError``. :func:`oom_attrs` recognises the three and returns the event's attributes: the
bytes asked for, the device, the step's batch and sequence length when the run's config names
them, and the device's memory statistics (``torch.cuda.memory_stats``) when CUDA is in use. It
never imports torch (a process that has not imported it cannot have raised its error) and never
raises.
"""

from __future__ import annotations

import re
import sys
from typing import Any

__all__ = ["oom_attrs"]

_CPU = re.compile(r"can't allocate memory: you tried to allocate (\d+) bytes")
_CUDA = re.compile(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)", re.IGNORECASE)
_GPU = re.compile(r"GPU (\d+) has a total capacity of ([\d.]+) (B|KiB|MiB|GiB|TiB)")
_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
# Config keys a training script commonly uses for the shape of a step's batch.
_BATCH_KEYS = ("micro_batch_size", "batch_size", "per_device_train_batch_size", "global_batch_size")
_SEQ_KEYS = ("seq_len", "seq_length", "sequence_length", "max_seq_len", "max_seq_length")
# The device statistics worth keeping of torch.cuda.memory_stats() (bytes, counts).
_STATS = (
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "active_bytes.all.peak",
    "inactive_split_bytes.all.current",
    "num_alloc_retries",
    "num_ooms",
)


def _bytes(value: str, unit: str) -> int:
    return int(float(value) * _UNITS[unit.lower()])


def _first(config: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        v = config.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return v
    return None


def _cuda_stats(attrs: dict[str, Any]) -> None:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_available() or not cuda.is_initialized():
            return
        stats = cuda.memory_stats()
        attrs["memory_stats"] = {k: int(stats[k]) for k in _STATS if k in stats}
        free, total = cuda.mem_get_info()
        attrs["device_free_bytes"], attrs["device_total_bytes"] = int(free), int(total)
    except Exception:  # a broken driver must not turn an OOM report into a crash
        return


def oom_attrs(exc: BaseException, config: dict[str, Any]) -> dict[str, Any] | None:
    """The ``oom`` event's attributes when ``exc`` is an out-of-memory error, else None."""
    try:
        name = type(exc).__name__
        text = str(exc)
    except Exception:
        return None
    cpu = _CPU.search(text)
    cuda = "out of memory" in text.lower()
    if not (name == "OutOfMemoryError" or isinstance(exc, MemoryError) or cpu or cuda):
        return None
    attrs: dict[str, Any] = {"type": type(exc).__qualname__}
    if cpu:
        attrs["device"] = "cpu"
        attrs["requested_bytes"] = int(cpu.group(1))
    else:
        if m := _CUDA.search(text):
            attrs["requested_bytes"] = _bytes(m.group(1), m.group(2))
        if m := _GPU.search(text):
            attrs["device"] = f"cuda:{m.group(1)}"
            attrs["device_total_bytes"] = _bytes(m.group(2), m.group(3))
        elif isinstance(exc, MemoryError):
            attrs["device"] = "cpu"
        _cuda_stats(attrs)
    if (batch := _first(config, _BATCH_KEYS)) is not None:
        attrs["batch_size"] = batch
    if (seq := _first(config, _SEQ_KEYS)) is not None:
        attrs["seq_len"] = seq
    return attrs
