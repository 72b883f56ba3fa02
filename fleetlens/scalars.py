"""The scalar names fleetlens's own signals are logged under, per rank and step: the input
pipeline's (``Run.data``) and the rank's memory (the SDK's samples, ``fleetlens.sdk.memory``).
The SDK writes them and the server's analyses read them, so they are named once, here."""

from __future__ import annotations

__all__ = ["DATA_SCALARS", "DEVICE_MEMORY_SCALARS", "HOST_MEMORY_SCALARS"]

DEVICE_MEMORY_SCALARS = (
    "mem_allocated_bytes",
    "mem_reserved_bytes",
    "mem_max_allocated_bytes",
    "mem_total_bytes",
)
"""A rank's device memory (the CUDA caching allocator's), in bytes, as the SDK samples it
(:mod:`fleetlens.sdk.memory`): allocated, reserved, the allocator's peak and the capacity."""

HOST_MEMORY_SCALARS = ("host_used_bytes", "host_peak_bytes", "host_limit_bytes")
"""A rank's process memory, in bytes: used, its peak and the limit it runs against (the
resident set against the cgroup or the machine; the address space under ``RLIMIT_AS``)."""

DATA_SCALARS: dict[str, str] = {
    "queue_depth": "data/prefetch_queue_depth",
    "cache_hit_rate": "data/cache_hit_rate",
    "read_latency_s": "data/storage_read_latency_s",
    "bytes_read": "data/bytes_read",
}
"""The input pipeline's signals (seed 001 s13), as the scalar names ``Run.data`` logs them under
(per rank and step): the prefetch queue's depth, the cache hit rate (0..1), the storage read
latency of the step's reads (seconds) and the bytes read. The shard a rank reads is a
``data_shard`` event, sent when it changes."""
