"""A benchmark example as the evaluator reads it.

An example is a row of the benchmark's dataset (inline, a JSONL file, HumanEval, an lm-eval
task's rendered documents): the fields below are the ones fleetlens reads; a row may carry any
others, which travel with it untouched (they are part of its dataset's content hash).
"""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["Example"]


class Example(TypedDict, total=False):
    id: str  # unique within the benchmark (the row's index when it has none)
    prompt: Any  # what the model is asked (through the prompt template)
    answer: Any  # the reference answer
    answers: list[Any]  # several acceptable answers
    choices: list[Any]  # multiple choice: the choices' texts
    continuations: list[str]  # multiple choice: what is scored after the prompt, per choice
    gold: Any  # multiple choice: the right choice's index (or indices)
    test: str  # HumanEval: the unit tests of the completed program
    entry_point: str  # HumanEval: the function the tests check
