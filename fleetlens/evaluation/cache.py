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

__all__ = ["EVALUATOR_VERSION", "PROVENANCE_FIELDS", "cache_key", "canonical_hash"]

EVALUATOR_VERSION = "fleetlens-eval-1"

PROVENANCE_FIELDS = (
    "modelHash",
    "benchmarks",  # [{name, version, datasetHash, promptTemplateVersion, metric}]
    "evaluatorVersion",
    "decoding",
    "codeCommit",
)


def canonical_hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def cache_key(provenance: dict[str, Any]) -> str:
    return canonical_hash({k: provenance.get(k) for k in PROVENANCE_FIELDS})
