"""Evaluation metrics and the statistics of comparing two models: pure functions, no I/O.

Per-example scorers (exact match, token F1, accuracy), the unbiased pass@k estimator of Chen et
al. (2021), perplexity from token log-probabilities, a mean with its standard error, and the two
paired tests the quality gates use: McNemar's exact test on binary outcomes and a paired
bootstrap interval on the mean difference.
"""

from __future__ import annotations

import math
import random
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = [
    "Summary",
    "accuracy",
    "bleu",
    "chrf",
    "exact_match",
    "math_accuracy",
    "mcnemar_exact",
    "normalize_answer",
    "paired_bootstrap",
    "pass_at_k",
    "perplexity",
    "rouge_l",
    "summarize",
    "token_f1",
]

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, references: Sequence[str]) -> float:
    return float(any(normalize_answer(prediction) == normalize_answer(r) for r in references))


def token_f1(prediction: str, references: Sequence[str]) -> float:
    """Best SQuAD token F1 of the prediction against any reference."""
    best = 0.0
    pred = normalize_answer(prediction).split()
    for ref in references:
        gold = normalize_answer(ref).split()
        if not pred or not gold:
            best = max(best, float(pred == gold))
            continue
        common = sum((Counter(pred) & Counter(gold)).values())
        if common:
            p, r = common / len(pred), common / len(gold)
            best = max(best, 2 * p * r / (p + r))
    return best


def accuracy(prediction: str, answer: str) -> float:
    """A choice question: the first non-space token of the prediction is the answer label."""
    words = prediction.strip().split()
    return float(bool(words) and words[0].strip(string.punctuation) == answer.strip())


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def _number(text: str) -> float | None:
    """The last number in a text (GSM8K style: '... so the answer is 1,234.'), fractions too."""
    found = _NUMBER.findall(text.replace("$", ""))
    if not found:
        return None
    raw = found[-1].replace(",", "")
    try:
        if "/" in raw:
            num, den = raw.split("/")
            return float(num) / float(den)
        return float(raw)
    except (ValueError, ZeroDivisionError):
        return None


def math_accuracy(prediction: str, answer: str, tolerance: float = 1e-6) -> float:
    """The last number of the prediction equals the answer's (within a relative tolerance)."""
    got, want = _number(prediction), _number(answer)
    if got is None or want is None:
        return 0.0
    return float(abs(got - want) <= tolerance * max(1.0, abs(want)))


def bleu(prediction: str, references: Sequence[str]) -> float:
    """Sentence BLEU (sacrebleu, 0-1)."""
    import sacrebleu

    return float(sacrebleu.sentence_bleu(prediction, list(references)).score) / 100.0


def chrf(prediction: str, references: Sequence[str]) -> float:
    """Sentence chrF (sacrebleu, 0-1)."""
    import sacrebleu

    return float(sacrebleu.sentence_chrf(prediction, list(references)).score) / 100.0


def rouge_l(prediction: str, references: Sequence[str]) -> float:
    """Best ROUGE-L F-measure against any reference (rouge-score, stemmed)."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return max((scorer.score(r, prediction)["rougeL"].fmeasure for r in references), default=0.0)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` passed: 1 - C(n-c, k) / C(n, k).

    Computed as a product so that it stays exact for large n (no huge binomials).
    """
    if not 0 <= c <= n or k < 1:
        raise ConfigError(f"pass@k needs 0 <= c <= n and k >= 1; got n={n}, c={c}, k={k}")
    if k > n:
        raise ConfigError(f"pass@{k} needs at least {k} samples per problem; got n={n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def perplexity(token_logprobs: Sequence[float]) -> float:
    """exp of the mean negative log-likelihood per token (natural log)."""
    if not token_logprobs:
        raise ConfigError("perplexity needs at least one token log-probability")
    return math.exp(-sum(token_logprobs) / len(token_logprobs))


@dataclass(frozen=True)
class Summary:
    mean: float
    stderr: float
    n: int

    def as_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "stderr": self.stderr, "n": self.n}


def summarize(values: Sequence[float]) -> Summary:
    """Mean and its standard error (sample standard deviation / sqrt(n))."""
    n = len(values)
    if n == 0:
        return Summary(math.nan, math.nan, 0)
    mean = math.fsum(values) / n
    if n == 1:
        return Summary(mean, 0.0, 1)
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return Summary(mean, math.sqrt(var / n), n)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs.

    ``b``: pairs the baseline got right and the candidate wrong; ``c``: the reverse. Under the
    null each discordant pair goes either way with probability 1/2.
    """
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = math.fsum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def paired_bootstrap(
    diffs: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of paired differences (deterministic seed)."""
    n = len(diffs)
    if n == 0:
        return (math.nan, math.nan)
    rng = random.Random(seed)
    means = sorted(math.fsum(rng.choices(diffs, k=n)) / n for _ in range(resamples))
    alpha = (1.0 - confidence) / 2.0
    lo = means[max(0, math.floor(alpha * resamples))]
    hi = means[min(resamples - 1, math.ceil((1.0 - alpha) * resamples) - 1)]
    return (lo, hi)
