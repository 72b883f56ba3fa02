"""LLM-as-a-judge with a versioned configuration.

A judge is a model behind any adapter (an OpenAI-compatible endpoint in practice), asked with a
versioned prompt and rubric to score a response. Everything that changes a verdict is part of
the configuration and so of the evaluation's provenance and cache key: judge model and version,
prompt and prompt version, rubric version, temperature and number of samples. The judge answers
``SCORE: <number>`` and a rationale; the score (mean over samples) and the first rationale are
kept per example.
"""

from __future__ import annotations

import functools
import json
import re

from ..errors import ConfigError
from .adapters import Adapter, Decoding, adapter_from_spec, validate_spec
from .doc_types import AdapterSpec, BenchmarkSpec, JudgeProvenance, JudgeSpec

__all__ = ["judge", "judge_config", "judge_provenance"]

_SCORE = re.compile(r"SCORE:\s*(-?[0-9]+(?:\.[0-9]+)?)", re.IGNORECASE)


def judge_config(spec: BenchmarkSpec) -> JudgeSpec:
    """A benchmark's judge, checked: every field that can change a verdict given, and an
    adapter that can be built."""
    js = spec.judge
    if js is None:
        raise ConfigError("metric 'judge' needs a 'judge' object in the benchmark spec")
    validate_spec(dict(js.adapter))
    return js


def judge_provenance(cfg: JudgeSpec) -> JudgeProvenance:
    """What the judge's scores depend on (its adapter without its secret)."""
    return JudgeProvenance(
        model=cfg.model,
        model_version=cfg.model_version,
        prompt_version=cfg.prompt_version,
        rubric_version=cfg.rubric_version,
        temperature=cfg.temperature,
        samples=cfg.samples,
        adapter=AdapterSpec.of(cfg.adapter).provenance(),
    )


@functools.lru_cache(maxsize=8)
def _adapter(spec_json: str) -> Adapter:
    return adapter_from_spec(json.loads(spec_json))


def judge(
    cfg: JudgeSpec, example_id: str, prompt: str, response: str, reference: str
) -> tuple[float, str]:
    """The judge's score (mean over samples) and its first rationale."""
    ask = cfg.prompt.format(prompt=prompt, response=response, reference=reference)
    gen = _adapter(json.dumps(cfg.adapter, sort_keys=True)).generate(
        ask,
        Decoding(temperature=cfg.temperature, n=cfg.samples, max_tokens=cfg.max_tokens),
        f"judge:{example_id}",
    )
    scores = []
    for text in gen.texts:
        m = _SCORE.search(text)
        if m is None:
            raise ConfigError(f"the judge's answer has no 'SCORE: <number>': {text[:120]!r}")
        scores.append(float(m.group(1)))
    first = gen.texts[0]
    rationale = _SCORE.sub("", first).strip()
    return sum(scores) / len(scores), rationale[:2000]
