"""What an evaluation keeps of each example beside its scores: the prompt the model was given,
its answer and the expected one (fleetlens/evaluation/worker.py ``shown``)."""

from __future__ import annotations

import pytest

from fleetlens.evaluation.adapters import Generation
from fleetlens.evaluation.doc_types import BenchmarkSpec
from fleetlens.evaluation.worker import SHOWN_CHARS, shown

pytestmark = pytest.mark.unit


def test_a_generated_answer_keeps_its_prompt_output_and_references() -> None:
    spec = BenchmarkSpec.of({"name": "qa", "metrics": ["exact_match"]})
    ex = {"id": "7", "prompt": "Q?", "answers": ["Paris", "paris"]}
    got = shown(spec, ex, "Question: Q?\\nAnswer:", Generation(texts=["Lyon", "Paris"]))
    assert got == {
        "prompt": "Question: Q?\\nAnswer:",
        "output": "Lyon",
        "reference": "Paris | paris",
    }


def test_a_multiple_choice_answer_is_the_choice_ranked_first() -> None:
    spec = BenchmarkSpec.of({"name": "mc", "metrics": ["acc"]})
    ex = {"id": "1", "choices": [" red", " green", " blue"], "gold": 2}
    got = shown(spec, ex, "Sky:", Generation(texts=[], loglikelihoods=[-3.0, -0.5, -1.0]))
    assert (got["output"], got["reference"]) == (" green", " blue")


def test_texts_are_bounded() -> None:
    got = shown(
        BenchmarkSpec.of({"metrics": []}),
        {"answer": "y" * 10**5},
        "x" * 10**5,
        Generation(texts=["z" * 10**5]),
    )
    assert {len(v) for v in got.values()} == {SHOWN_CHARS}
