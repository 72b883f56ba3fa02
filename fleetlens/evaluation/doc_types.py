"""The JSON documents of evaluation, typed: the user's specs (adapter, benchmark, judge, gate
policy, prices), what an evaluation records (provenance, gate reports, regressions) and what a
callable adapter answers.

Each is declared once here with snake_case fields; its JSON keys are camelCase by the model's
own rule (:func:`camel`), so a document read or written keeps the keys users and stored rows
have always had. Digits stay a segment of their own: ``input_per_1k_tokens`` is
``inputPer1kTokens``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigError

__all__ = [
    "SOURCES",
    "AdapterSpec",
    "AliasMoveAudit",
    "BenchmarkFields",
    "BenchmarkProvenance",
    "BenchmarkSpec",
    "CallableAnswer",
    "CheckRecord",
    "Doc",
    "JudgeProvenance",
    "JudgeSpec",
    "PolicySpec",
    "Price",
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

    @classmethod
    def of(cls, j: Any) -> JudgeSpec:
        """The judge object checked: every field that can change a verdict given (its
        adapter is checked by :func:`.judge.judge_config`)."""
        if not isinstance(j, dict):
            raise ConfigError("metric 'judge' needs a 'judge' object in the benchmark spec")
        missing = [
            f.alias
            for f in cls.model_fields.values()
            if f.is_required() and f.alias and not j.get(f.alias)
        ]
        if missing:
            raise ConfigError(
                f"judge configuration is missing {missing}; every field that can "
                "change a verdict is versioned"
            )
        try:
            js = cls.model_validate(j)
        except ValidationError as exc:
            raise invalid("judge", exc) from exc
        if js.samples < 1 or js.temperature < 0:
            raise ConfigError("judge samples must be >= 1 and temperature >= 0")
        return js


SOURCES = ("humaneval", "inline", "jsonl", "lm_eval")
"""Where a benchmark's examples come from (:mod:`.benchmarks`)."""


class BenchmarkFields(Doc):
    """The fields of a benchmark spec read as documents (by their camelCase keys)."""

    prompt_template: PromptTemplate | None = None  # none: the example's prompt as it is
    timeout_s: float = 10.0  # how long a generated program may run in the sandbox


@dataclass(frozen=True, slots=True)
class BenchmarkSpec:
    """One benchmark of a suite, read once from the user's JSON (:func:`.benchmarks.
    normalize_spec`): the fields fleetlens reads, typed, and the JSON as it was given, unknown
    keys included (:meth:`as_json`: what an evaluation stores, what its hashes are computed
    over and what a worker is sent). The inline examples are the JSON's own rows: numbering
    them when they are loaded numbers them in the stored spec too, as it always has."""

    name: str
    version: str
    source: str  # one of SOURCES
    metrics: tuple[str, ...]  # as given (none: exact_match, see scored_metrics)
    k: tuple[int, ...]  # pass@k's k, as given (none: 1)
    examples: tuple[Any, ...]  # inline: the rows, as given
    path: str  # jsonl: a file on the server
    task: str  # lm_eval: a task YAML on the server
    classifier: str  # safety: package.module:function
    prompt_template: PromptTemplate
    timeout_s: float
    judge: JudgeSpec | None  # set when the judge metric is scored
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, raw: Any) -> BenchmarkSpec:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"a benchmark spec is an object {{name, source, ...}}, got {raw!r}")
        name = raw.get("name", "")
        if not isinstance(name, str):
            raise ConfigError(f"benchmark name {name!r} must be a string")
        source = raw.get("source", "inline")
        if source not in SOURCES:
            raise ConfigError(f"benchmark source {source!r} is unknown; use one of {SOURCES}")
        metrics = raw.get("metrics") or []
        if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
            raise ConfigError(f"benchmark {name!r}: metrics {metrics!r} must be a list of names")
        examples = raw.get("examples") or []
        if not isinstance(examples, list):
            raise ConfigError(f"benchmark {name!r}: examples must be a list of objects")
        try:
            k = tuple(int(v) for v in raw.get("k") or [])
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"benchmark {name!r}: k {raw.get('k')!r} must be integers") from exc
        try:
            fields = BenchmarkFields.model_validate(raw)
        except ValidationError as exc:
            raise invalid(f"benchmark {name!r}", exc) from exc
        return cls(
            name=name,
            version=str(raw.get("version", "")),
            source=str(source),
            metrics=tuple(metrics),
            k=k,
            examples=tuple(examples),
            path=str(raw.get("path", "")),
            task=str(raw.get("task") or ""),
            classifier=str(raw.get("classifier", "")),
            prompt_template=fields.prompt_template or PromptTemplate(),
            timeout_s=fields.timeout_s,
            judge=JudgeSpec.of(raw.get("judge")) if "judge" in metrics else None,
            raw=dict(raw),
        )

    @property
    def scored_metrics(self) -> tuple[str, ...]:
        return self.metrics or ("exact_match",)

    def as_json(self) -> Any:
        """The spec as the user's JSON: the keys and values given (a shallow copy)."""
        return dict(self.raw)

    def without_examples(self) -> BenchmarkSpec:
        """The spec a worker is sent: its examples come beside it, a shard's worth."""
        raw = {k: v for k, v in self.raw.items() if k != "examples"}
        return replace(self, examples=(), raw=raw)


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
