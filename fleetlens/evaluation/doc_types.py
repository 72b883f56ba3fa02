"""The JSON documents of evaluation, typed: the user's specs (adapter, judge, gate policy,
prices), what an evaluation records (provenance, gate reports, regressions) and what a callable
adapter answers.

Each is declared once here with snake_case fields; its JSON keys are camelCase by the model's
own rule (:func:`camel`), so a document read or written keeps the keys users and stored rows
have always had. Digits stay a segment of their own: ``input_per_1k_tokens`` is
``inputPer1kTokens``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigError

__all__ = [
    "AdapterSpec",
    "AliasMoveAudit",
    "BenchmarkProvenance",
    "BenchmarkTemplate",
    "CallableAnswer",
    "CheckRecord",
    "Doc",
    "JudgeProvenance",
    "JudgeSpec",
    "PolicySpec",
    "Price",
    "ProgramLimits",
    "PromptTemplate",
    "Provenance",
    "RegressionRecord",
    "ReportRecord",
    "SuiteSpec",
    "TemplateValues",
    "camel",
    "invalid",
]


def camel(name: str) -> str:
    """``snake_case`` as ``camelCase``, each segment kept as written after its first letter."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class Doc(BaseModel):
    """A JSON document with camelCase keys; read by key or by field name."""

    model_config = ConfigDict(alias_generator=camel, populate_by_name=True, frozen=True)

    def as_json(self) -> Any:
        """The document as its JSON value: the keys it was given or built with, camelCase."""
        return self.model_dump(by_alias=True, exclude_unset=True)


def invalid(what: str, exc: ValidationError) -> ConfigError:
    """A spec that does not fit its model, said in the user's words (its JSON keys)."""
    errs = [f"{'.'.join(str(p) for p in e['loc']) or what}: {e['msg']}" for e in exc.errors()[:3]]
    return ConfigError(f"{what} is invalid: " + "; ".join(errs))


class AdapterSpec(Doc):
    """How a worker reaches a model (:mod:`.adapters`): the fields read here, and any others
    the user's spec carries (kept, e.g. for templates)."""

    model_config = ConfigDict(extra="allow")

    kind: Any = None
    target: str = ""  # callable: package.module:function
    base_url: str = ""  # openai: http://host:port
    model: str = ""
    path: str = ""  # hf: a checkpoint directory
    api_key_env: str = ""  # the environment variable holding the API key: never recorded

    @classmethod
    def of(cls, spec: dict[str, Any]) -> AdapterSpec:
        try:
            return cls.model_validate(spec)
        except ValidationError as exc:
            raise invalid("adapter", exc) from exc

    def provenance(self) -> Any:
        """The spec as recorded with a result: without where the API key lives."""
        return self.model_dump(by_alias=True, exclude_unset=True, exclude={"api_key_env"})


class AliasMoveAudit(Doc):
    """An alias move as the audit log records it."""

    from_version: str | None = Field(serialization_alias="from")
    to: str
    decision_id: str | None
    reason: str


class TemplateValues(Doc):
    """What a trigger's adapter template may name: ``{checkpointUri}`` and the like."""

    model_id: str
    model_version: str
    run_id: str
    checkpoint_id: str
    checkpoint_uri: str


class CallableAnswer(Doc):
    """One sample a callable adapter returned as an object rather than a string."""

    text: Any
    logprobs: list[float] | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None


class Price(Doc):
    """A row of a suite's price table, per 1000 tokens."""

    model_config = ConfigDict(extra="forbid")

    input_per_1k_tokens: float = 0.0
    output_per_1k_tokens: float = 0.0


class PromptTemplate(Doc):
    """How a benchmark's example becomes the prompt: ``text`` with ``{prompt}``, versioned."""

    version: Any = ""
    text: Any = "{prompt}"


class BenchmarkTemplate(Doc):
    """The prompt template a benchmark spec names (none: the example's prompt as it is)."""

    prompt_template: PromptTemplate | None = None

    @classmethod
    def of(cls, spec: dict[str, Any]) -> PromptTemplate:
        try:
            found = cls.model_validate(spec).prompt_template
        except ValidationError as exc:
            raise invalid(f"benchmark {spec.get('name', '')!r}", exc) from exc
        return found or PromptTemplate()


class ProgramLimits(Doc):
    """How long a benchmark's generated program may run in the sandbox (``timeoutS``)."""

    timeout_s: float = 10.0

    @classmethod
    def of(cls, spec: dict[str, Any]) -> float:
        """The benchmark's wall-clock limit a program, in seconds."""
        try:
            return cls.model_validate(spec).timeout_s
        except ValidationError as exc:
            raise invalid(f"benchmark {spec.get('name', '')!r}", exc) from exc


class SuiteSpec(Doc):
    """A suite as a request or the registry gives it: the fields read here, and any others."""

    model_config = ConfigDict(extra="allow")

    name: Any = ""
    version: Any = ""
    benchmarks: Any = None
    adapter: Any = None
    decoding: Any = None
    prices: Any = None
    gates: Any = None
    # what the registry's answer about a suite adds; dropped when it comes back as a spec
    spec_hash: Any = None
    created_at: Any = None
    created_by: Any = None
    created: Any = None

    def spec(self) -> Any:
        """The suite's own fields, as given."""
        return self.model_dump(
            by_alias=True,
            exclude_unset=True,
            exclude={"spec_hash", "created_at", "created_by", "created"},
        )


class JudgeSpec(Doc):
    """A benchmark's ``judge`` object: every field that can change a verdict, versioned."""

    adapter: dict[str, Any]
    model: str
    model_version: str
    prompt: str  # with {prompt}, {response} and {reference}
    prompt_version: str
    rubric_version: str
    temperature: float = 0.0
    samples: int = 1
    max_tokens: int = 256


class JudgeProvenance(Doc):
    model: str
    model_version: str
    prompt_version: str
    rubric_version: str
    temperature: float
    samples: int
    adapter: Any  # the adapter spec without its secret


class BenchmarkProvenance(Doc):
    """What a benchmark's scores depend on."""

    name: str
    version: str
    dataset_hash: str
    prompt_template_version: str
    metrics: list[str]
    k: list[Any]
    examples: int
    judge: JudgeProvenance | None = None  # set only for a judged benchmark


CACHED_FIELDS = {"model_hash", "benchmarks", "evaluator_version", "decoding", "code_commit"}
"""The provenance a cached result must share to be reused."""


class Provenance(Doc):
    """Everything an evaluation's scores depend on, and the cache key over it."""

    model_hash: str
    benchmarks: list[BenchmarkProvenance]
    evaluator_version: str
    decoding: Any
    code_commit: str
    adapter: Any
    prices: Any = None  # set only when the suite prices its model
    cache_key: str = ""

    def cached(self) -> Any:
        """The part of the provenance the cache key is computed over."""
        return self.model_dump(by_alias=True, exclude_unset=True, include=CACHED_FIELDS)


class PolicySpec(Doc):
    """A gate policy as the user writes it (:func:`.gates.parse_policies` checks it)."""

    metric: Any = ""
    direction: str | None = None
    max_regression: float = 0.0
    hard: bool = True
    test: str = "bootstrap"
    confidence: float = 0.95
    kind: str = ""
    minimum: float | None = Field(default=None, alias="min")
    maximum: float | None = Field(default=None, alias="max")


class CheckRecord(Doc):
    """A judged gate policy as a gate decision's report keeps it."""

    metric: str
    direction: str
    hard: bool
    test: str
    confidence: float | None
    max_regression: float
    candidate: float | None
    baseline: float | None
    paired: int
    difference: float | None
    interval: list[float] | None
    p_value: float | None
    regression: bool
    reasons: list[str]
    status: str


class ReportRecord(Doc):
    """A gate decision's ``report`` column."""

    passed: bool
    failed: list[str]
    warnings: list[str]
    checks: list[CheckRecord]
    baseline_alias: str
    baseline_version: str | None
    baseline_evaluation: str | None
    candidate_evaluation: str


class RegressionRecord(Doc):
    """A failing check of an evaluation, kept in its ``regressions`` column (alerts read it)."""

    kind: str
    metric: str
    candidate: float | None = None
    baseline: float | None = None
    difference: float | None = None
    status: str
    reasons: list[str]
    baseline_version: str | None = None
    baseline_evaluation: str | None = None
