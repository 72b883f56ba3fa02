"""A tiny causal LM built here, and a real multiple-choice task for it, with nothing fetched.

- The data: the MMLU dev-set questions (Hendrycks et al. 2021, MIT licence) that
  lm-evaluation-harness ships in ``lm_eval/tasks/mmlu/flan_cot_fewshot/_cot_prompts.json``,
  kept verbatim in ``tests/data/real/lm_eval_mmlu_dev/``; :func:`mmlu_dev_rows` parses each
  ``Q: ... (A) .. (B) .. (C) .. (D) .. A: ... The answer is (X).`` into a document
  ``{subject, question, choices, answer}`` (272 questions; the chain-of-thought is dropped).
- The task: an lm-eval task YAML over those documents as a local JSON-lines file
  (``dataset_path: json``, ``data_files``), ARC-style: the question, then each choice's text
  as the continuation, metrics acc and acc_norm.
- The model: a GPT-2 architecture with 2 layers of width 64, its weights drawn with a fixed
  seed (untrained), and a byte-level BPE tokenizer trained on the questions, saved with
  ``save_pretrained`` so that lm-eval's ``hf`` model and fleetlens' ``hf`` adapter load the
  same directory.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COT_PROMPTS = os.path.join(ROOT, "tests", "data", "real", "lm_eval_mmlu_dev", "_cot_prompts.json")
_QUESTION = re.compile(
    r"Q: (.*?)\n\(A\) (.*?) \(B\) (.*?) \(C\) (.*?) \(D\) (.*?)\nA: .*?The answer is \(([ABCD])\)",
    re.S,
)

TASK_YAML = """\
task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
description: "Questions about {{{{subject | replace('_', ' ')}}}}.\\n\\n"
doc_to_text: "Question: {{{{question.strip()}}}}\\nAnswer:"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


def mmlu_dev_rows() -> list[dict[str, Any]]:
    with open(COT_PROMPTS, encoding="utf-8") as fh:
        prompts = json.load(fh)
    rows = []
    for subject, text in prompts.items():
        for m in _QUESTION.finditer(text):
            q, a, b, c, d, ans = m.groups()
            if "\n" in a + b + c + d or "Q: " in q:
                continue
            rows.append({"subject": subject, "question": q, "choices": [a, b, c, d],
                         "answer": "ABCD".index(ans)})  # fmt: skip
    return rows


def write_task(folder: str, limit: int | None = None, task: str = "mmlu_dev_local") -> str:
    """The JSON-lines documents and the task YAML in ``folder``; returns the YAML's path."""
    rows = mmlu_dev_rows()[:limit]
    data = os.path.join(folder, f"{task}.jsonl")
    with open(data, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    path = os.path.join(folder, f"{task}.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(TASK_YAML.format(task=task, data=data))
    return path


def build_model(folder: str, seed: int = 0) -> str:
    """The tokenizer and the randomly initialised model saved in ``folder``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    corpus = [r["question"] + " " + " ".join(r["choices"]) for r in mmlu_dev_rows()]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )
    tok.save_pretrained(folder)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tok), n_positions=1024, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    GPT2LMHeadModel(config).eval().save_pretrained(folder)
    return folder


# Nothing from a hub: the datasets and transformers libraries stay on local files.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip


def offline_env() -> None:
    os.environ.update(OFFLINE)


def run_lm_eval(
    model_dir: str, task_yaml: str, batch_size: int = 1
) -> tuple[dict[str, Any], float]:
    """lm-eval's own evaluation (``simple_evaluate`` with ``log_samples``) and its wall time:
    the evaluation only (task loading included); importing lm_eval and loading the model
    (lm_eval's ``hf`` model, ``HFLM``) come before the clock, as fleetlens' workers load the
    model before their first shard."""
    import time

    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    task = os.path.splitext(os.path.basename(task_yaml))[0]
    model = HFLM(pretrained=model_dir, device="cpu", batch_size=batch_size)
    t0 = time.perf_counter()
    manager = TaskManager(include_path=os.path.dirname(task_yaml), include_defaults=False)
    out = lm_eval.simple_evaluate(
        model=model, tasks=[task], task_manager=manager, log_samples=True, num_fewshot=0
    )
    return out, time.perf_counter() - t0


def lm_eval_per_example(out: dict[str, Any], task: str) -> dict[str, dict[str, float]]:
    """lm-eval's per-document acc/acc_norm (and its log-likelihoods), by document index."""
    per = {}
    for s in out["samples"][task]:
        lls = [float(r[0]) for r in s["filtered_resps"]]
        per[str(s["doc_id"])] = {"acc": float(s["acc"]), "acc_norm": float(s["acc_norm"]),
                                 "lls": lls}  # type: ignore[dict-item]  # fmt: skip
    return per
