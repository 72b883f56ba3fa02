"""The shard lease protocol as the worker speaks it: the requests it sends to the server's
evaluation API and the leased shard it gets back, typed (camelCase on the wire, by the
documents' own rule; :mod:`.doc_types`)."""

from __future__ import annotations

from typing import Any, cast

from pydantic import Field

from .doc_types import BenchmarkSpec, Doc
from .example_types import Example

__all__ = ["CompleteAsk", "FailAsk", "HeartbeatAsk", "LeaseAsk", "LeasedShard"]

ShardScores = dict[str, dict[str, float | str]]  # example id -> metric -> value (or text)


class LeaseAsk(Doc):
    """Ask for the next shard, preferably one whose model this worker has loaded."""

    worker_id: str
    prefer_locality: str
    lease_s: float


class LeasedShard(Doc):
    """A shard leased to this worker: what to run, with what, and the token every report must
    carry."""

    shard_id: int
    benchmark: dict[str, Any]  # the user's benchmark spec
    examples: list[dict[str, Any]]  # the shard's examples, as the dataset has them
    completed_ids: list[str] = Field(default_factory=list)  # scored by an earlier attempt
    adapter: dict[str, Any]  # the user's adapter spec
    decoding: dict[str, Any]
    locality: str = ""
    lease_token: str

    def benchmark_spec(self) -> BenchmarkSpec:
        """The benchmark spec, read (as the server read it when the evaluation was submitted)."""
        return BenchmarkSpec.of(self.benchmark)

    def examples_read(self) -> list[Example]:
        """The examples, as the evaluator reads them (dataset rows: JSON as the server sent)."""
        return [cast(Example, e) for e in self.examples]


class HeartbeatAsk(Doc):
    """Extend the lease; ``partial``: the results so far, when there are new ones."""

    lease_token: str
    lease_s: float
    partial: ShardScores | None


class CompleteAsk(Doc):
    lease_token: str
    scores: ShardScores


class FailAsk(Doc):
    lease_token: str
    error: str
