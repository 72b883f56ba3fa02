"""The JSON the evaluation API answers (evaluations, suites, triggers, the shard lease
protocol), as pydantic models; the gate and alias answers are in :mod:`.gate_models`.

Each model's ``of`` builds it from the typed value :mod:`fleetlens.evaluation` returns
(``rows.EvaluationView``, ``suites.SuiteView``, ``lease.ShardLease``, ...); the worker and the
CLI read the JSON. An adapter spec, a
benchmark spec and a benchmark's examples are the user's JSON, carried as they were sent.
Counts that the CLI prints (a metric's ``n``) keep their int or float as stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import Field

from .models import ApiModel

if TYPE_CHECKING:
    from ..evaluation.lease import Heartbeat, ShardLease, ShardReport
    from ..evaluation.results import ExampleRow
    from ..evaluation.rows import EvaluationView, Progress, ShardView
    from ..evaluation.suites import SuiteView, TriggerView

__all__ = [
    "DecodingOut",
    "EvaluationListOut",
    "EvaluationOut",
    "ExampleRowOut",
    "ExamplesOut",
    "HeartbeatOut",
    "LeaseOut",
    "MetricStatOut",
    "PriceOut",
    "ProgressOut",
    "ProvenanceOut",
    "RegressionOut",
    "ShardOut",
    "ShardReportOut",
    "SuiteListOut",
    "SuiteOut",
    "TriggerListOut",
    "TriggerOut",
]

EvaluationState = Literal["QUEUED", "RUNNING", "COMPLETED", "FAILED"]
ShardState = Literal["queued", "leased", "done", "failed"]


class DecodingOut(ApiModel):
    """The decoding configuration, normalised: every field present."""

    temperature: float
    top_p: float = Field(alias="top_p")
    max_tokens: int = Field(alias="max_tokens")
    n: int
    stop: list[str]
    seed: int
    logprobs: bool


class PriceOut(ApiModel):
    """One row of a suite's price table (a missing price counts as 0)."""

    input_per_1k_tokens: float = Field(0.0, alias="inputPer1kTokens")
    output_per_1k_tokens: float = Field(0.0, alias="outputPer1kTokens")


class MetricStatOut(ApiModel):
    """A metric's mean over the examples, its standard error, and the count behind it."""

    mean: float
    stderr: float
    n: int | float = Field(description="examples (tokens, for perplexity)")


class JudgeProvenanceOut(ApiModel):
    """The judge model and the versions of everything that can change its verdict."""

    model: str
    model_version: str
    prompt_version: str
    rubric_version: str
    temperature: float
    samples: int
    adapter: dict[str, Any] = Field(description="the judge's adapter spec, without apiKeyEnv")


class BenchmarkProvenanceOut(ApiModel):
    """What one benchmark of an evaluation was: its version, dataset and scoring."""

    name: str
    version: str
    dataset_hash: str
    prompt_template_version: str
    metrics: list[str]
    k: list[int] = Field(description="the k of pass@k; empty if not scored")
    examples: int
    judge: JudgeProvenanceOut | None = Field(None, description="only with the judge metric")


class ProvenanceOut(ApiModel):
    """Everything that determines an evaluation's scores (its cache key is their hash)."""

    model_hash: str
    benchmarks: list[BenchmarkProvenanceOut]
    evaluator_version: str
    decoding: DecodingOut
    code_commit: str
    adapter: dict[str, Any] = Field(description="the adapter spec, without apiKeyEnv")
    prices: dict[str, PriceOut] = Field(
        default_factory=dict, description="the suite's price table, only when it has one"
    )
    cache_key: str


class RegressionOut(ApiModel):
    """A check the evaluation failed (or warned on) against the production version's."""

    kind: Literal["safety", "benchmark", "latency", "cost"]
    metric: str = Field(description="benchmark/metric; empty when the gate could not judge")
    candidate: float | None = None
    baseline: float | None = None
    difference: float | None = None
    status: Literal["fail", "warn", "error"]
    reasons: list[str]
    baseline_version: str | None = None
    baseline_evaluation: str | None = None


class SuiteRefOut(ApiModel):
    """The suite an evaluation ran."""

    name: str | None
    version: str | None


class ShardOut(ApiModel):
    """One shard of an evaluation: a partition of one benchmark's examples."""

    shard_id: int
    index: int
    benchmark: str
    start: int
    stop: int
    state: ShardState
    attempts: int
    max_attempts: int
    done: int = Field(description="examples scored so far")
    total: int
    worker: str = Field(description="the worker that holds (or last held) it; empty if none")
    error: str

    @classmethod
    def of(cls, sh: ShardView) -> ShardOut:
        return cls(
            shard_id=sh.shard_id,
            index=sh.index,
            benchmark=sh.benchmark,
            start=sh.start,
            stop=sh.stop,
            state=cast(ShardState, sh.state),  # pydantic checks it
            attempts=sh.attempts,
            max_attempts=sh.max_attempts,
            done=sh.done,
            total=sh.total,
            worker=sh.worker,
            error=sh.error,
        )


class ProgressOut(ApiModel):
    """Examples and shards settled so far."""

    examples_done: int
    examples: int
    shards_done: int
    shards_failed: int
    shards: int

    @classmethod
    def of(cls, p: Progress) -> ProgressOut:
        return cls(
            examples_done=p.examples_done,
            examples=p.examples,
            shards_done=p.shards_done,
            shards_failed=p.shards_failed,
            shards=p.shards,
        )


class EvaluationOut(ApiModel):
    """An evaluation: what was judged, with what, and what came out (with its shards, when read
    alone or just submitted)."""

    evaluation_id: str
    state: EvaluationState
    model_id: str
    model_version: str
    run_id: str
    checkpoint_id: str
    priority: str = Field(description="P0 safety .. P3 exploratory")
    deadline: float | None
    cache_hit: bool
    cached_from: str | None = Field(description="the evaluation whose result was reused")
    cache_key: str
    provenance: ProvenanceOut
    metrics: dict[str, dict[str, MetricStatOut]] = Field(
        description="benchmark -> metric -> figure (benchmark 'performance': latency and cost)"
    )
    error: str
    created_at: float
    completed_at: float | None
    created_by: str
    suite: SuiteRefOut
    trigger_id: str | None
    regressions: list[RegressionOut] | None = Field(
        description="against the production version; null: not compared"
    )
    shards: list[ShardOut] | None = None
    progress: ProgressOut | None = None

    @classmethod
    def of(cls, v: EvaluationView) -> EvaluationOut:
        """The provenance, metrics and regressions are the JSON stored with the evaluation;
        ``shards`` and ``progress`` only when it was read with them."""
        opt: dict[str, Any] = {}
        if v.shards is not None:
            opt["shards"] = [ShardOut.of(sh) for sh in v.shards]
        if v.progress is not None:
            opt["progress"] = ProgressOut.of(v.progress)
        return cls(
            evaluation_id=v.evaluation_id,
            state=cast(EvaluationState, v.state),  # pydantic checks it
            model_id=v.model_id,
            model_version=v.model_version,
            run_id=v.run_id,
            checkpoint_id=v.checkpoint_id,
            priority=v.priority,
            deadline=v.deadline,
            cache_hit=v.cache_hit,
            cached_from=v.cached_from,
            cache_key=v.cache_key,
            provenance=ProvenanceOut.model_validate(v.provenance),
            metrics={
                bench: {name: MetricStatOut.model_validate(stat) for name, stat in ms.items()}
                for bench, ms in v.metrics.items()
            },
            error=v.error,
            created_at=v.created_at,
            completed_at=v.completed_at,
            created_by=v.created_by,
            suite=SuiteRefOut(name=v.suite_name, version=v.suite_version),
            trigger_id=v.trigger_id,
            regressions=None
            if v.regressions is None
            else [RegressionOut.model_validate(r) for r in v.regressions],
            **opt,
        )


class EvaluationListOut(ApiModel):
    """Evaluations, newest first (without their shards)."""

    evaluations: list[EvaluationOut]


class ExampleRowOut(ApiModel):
    """One example's score on one metric, with its notes and texts when it has them."""

    benchmark: str
    shard_index: int
    example_id: str
    metric: str
    value: float
    loglikelihoods: str = Field("", description="multiple choice: the choices' scores")
    rationale: str = Field("", description="a judge's rationale")
    prompt: str = ""
    output: str = ""
    reference: str = ""

    @classmethod
    def of(cls, r: ExampleRow) -> ExampleRowOut:
        """The notes and texts only when the example has them."""
        notes = (
            ("loglikelihoods", r.loglikelihoods),
            ("rationale", r.rationale),
            ("prompt", r.prompt),
            ("output", r.output),
            ("reference", r.reference),
        )
        present: dict[str, Any] = {k: x for k, x in notes if x}
        return cls(
            benchmark=r.benchmark,
            shard_index=r.shard_index,
            example_id=r.example_id,
            metric=r.metric,
            value=r.value,
            **present,
        )


class ExamplesOut(ApiModel):
    """An evaluation's per-example scores."""

    evaluation_id: str
    examples: list[ExampleRowOut]


# -- suites and triggers ------------------------------------------------------------------------


class SuiteOut(ApiModel):
    """A registered suite version: its spec as registered, and who registered it when."""

    name: str
    version: str
    description: str = ""
    benchmarks: list[dict[str, Any]] = Field(description="benchmark specs, as registered")
    gates: list[dict[str, Any]] = Field(
        default_factory=list, description="gate policies, as registered"
    )
    decoding: DecodingOut
    adapter: dict[str, Any] = Field(
        default_factory=dict, description="the default adapter (a template)"
    )
    prices: dict[str, PriceOut] = Field(default_factory=dict)
    spec_hash: str
    created_at: float
    created_by: str
    created: bool = Field(
        False, description="registration only: false when that version existed already"
    )

    @classmethod
    def of(cls, v: SuiteView) -> SuiteOut:
        """The spec as registered: its optional fields only when it has them."""
        spec = v.spec
        opt: dict[str, Any] = {k: spec[k] for k in ("description", "gates", "adapter") if k in spec}
        if "prices" in spec:
            opt["prices"] = {k: PriceOut.model_validate(p) for k, p in spec["prices"].items()}
        if v.created is not None:
            opt["created"] = v.created
        return cls(
            name=v.name,
            version=v.version,
            benchmarks=spec["benchmarks"],
            decoding=DecodingOut.model_validate(spec["decoding"]),
            spec_hash=v.spec_hash,
            created_at=v.created_at,
            created_by=v.created_by,
            **opt,
        )


class SuiteListOut(ApiModel):
    """Registered suites, every version."""

    suites: list[SuiteOut]


class TriggerOut(ApiModel):
    """A policy that starts evaluations."""

    trigger_id: str
    project: str = Field(description="empty: every project")
    on: Literal["model", "checkpoint", "alias"]
    model_id: str = Field(description="empty: any model")
    alias: str
    suite: str = Field(description="a registered suite: name or name@version")
    adapter: dict[str, Any] = Field(description="the adapter template")
    priority: str
    created_at: float
    created_by: str

    @classmethod
    def of(cls, t: TriggerView) -> TriggerOut:
        return cls(
            trigger_id=t.trigger_id,
            project=t.project,
            on=cast(Literal["model", "checkpoint", "alias"], t.on),  # pydantic checks it
            model_id=t.model_id,
            alias=t.alias,
            suite=t.suite,
            adapter=t.adapter,
            priority=t.priority,
            created_at=t.created_at,
            created_by=t.created_by,
        )


class TriggerListOut(ApiModel):
    """The policies that start evaluations."""

    triggers: list[TriggerOut]


# -- the worker protocol ------------------------------------------------------------------------


class LeaseOut(ApiModel):
    """A leased shard: what to run, with what, and the token every report must carry."""

    shard_id: int
    evaluation_id: str
    index: int
    benchmark: dict[str, Any] = Field(description="the benchmark spec, without its examples")
    start: int
    stop: int
    examples: list[dict[str, Any]] = Field(description="the shard's examples, as the dataset has")
    completed_ids: list[str] = Field(description="examples scored by an earlier attempt")
    adapter: dict[str, Any]
    decoding: DecodingOut
    locality: str
    lease_token: str
    lease_expires: float
    attempt: int

    @classmethod
    def of(cls, v: ShardLease) -> LeaseOut:
        return cls(
            shard_id=v.shard_id,
            evaluation_id=v.evaluation_id,
            index=v.index,
            benchmark=v.benchmark.as_json(),
            start=v.start,
            stop=v.stop,
            examples=[dict(e) for e in v.examples],
            completed_ids=v.completed_ids,
            adapter=v.adapter,
            decoding=DecodingOut.model_validate(v.decoding),
            locality=v.locality,
            lease_token=v.lease_token,
            lease_expires=v.lease_expires,
            attempt=v.attempt,
        )


class HeartbeatOut(ApiModel):
    """The lease, extended."""

    shard_id: int
    lease_expires: float

    @classmethod
    def of(cls, v: Heartbeat) -> HeartbeatOut:
        return cls(shard_id=v.shard_id, lease_expires=v.lease_expires)


class ShardReportOut(ApiModel):
    """A shard's state after a completion or failure report, and its evaluation's."""

    shard_id: int
    state: Literal["done", "queued", "failed"] = Field(description="queued: it will be retried")
    evaluation_state: EvaluationState

    @classmethod
    def of(cls, v: ShardReport) -> ShardReportOut:
        return cls(
            shard_id=v.shard_id,
            state=cast(Literal["done", "queued", "failed"], v.state),  # pydantic checks it
            evaluation_state=cast(EvaluationState, v.evaluation_state),
        )
