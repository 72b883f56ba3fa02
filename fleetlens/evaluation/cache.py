"""Provenance of an evaluation result and the cache key over it.

A result is reusable only if everything that could change it is the same: the model (content
hash of its checkpoint, or of the adapter spec when there is no checkpoint), each benchmark's
dataset content hash, benchmark and prompt-template versions, the evaluator version, the
decoding configuration and the code commit. The key is SHA-256 over the canonical JSON of all
of them, so changing any one field misses.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .doc_types import Provenance

__all__ = ["EVALUATOR_VERSION", "cache_key", "canonical_hash"]

EVALUATOR_VERSION = "fleetlens-eval-1"


def canonical_hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def cache_key(provenance: Provenance) -> str:
    """SHA-256 over the canonical JSON of the provenance fields a reused result must share
    (:data:`.doc_types.CACHED_FIELDS`), under their JSON keys."""
    return canonical_hash(provenance.cached())
