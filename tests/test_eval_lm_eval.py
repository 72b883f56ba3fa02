"""lm-evaluation-harness task YAMLs in fleetlens: the same per-example acc and acc_norm as lm_eval
itself on the same model and task (lm_eval runs in the test), the task file's rules, the clear
refusals, and the way in over HTTP and the CLI.

The model is a tiny GPT-2 built in the test; the task is the MMLU dev questions lm-eval ships,
as a local JSON-lines file (bench/_tiny_lm.py). Nothing is fetched from a hub.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import _tiny_lm as tiny
from fleetlens.errors import AdapterError, ConfigError
from fleetlens.evaluation import benchmarks as bm
from fleetlens.evaluation.adapters import Generation, HFAdapter
from fleetlens.evaluation.lm_eval_tasks import choice_scores, load_task
from fleetlens.evaluation.loglikelihood import echo_loglikelihood, encode_pair
from fleetlens.testing import Server

from .test_eval_support import start_worker, wait_for

pytestmark = pytest.mark.unit

DOCS = 40  # of the 272 questions: enough for both metrics to differ from each other
TASK = "mmlu_dev_local"


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # lm_eval and fleetlens alike; kind to a shared machine
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in tiny.OFFLINE.items():
                mp.setenv(key, value)
            folder = tmp_path_factory.mktemp("lm")
            model = tiny.build_model(str(folder / "model"))
            task = tiny.write_task(str(folder), limit=DOCS, task=TASK)
            out, _ = tiny.run_lm_eval(model, task)
            yield {"model": model, "task": task, "ref": tiny.lm_eval_per_example(out, TASK)}
    finally:
        torch.set_num_threads(threads)


@pytest.mark.e2e
def test_acc_and_acc_norm_per_example_equal_lm_evals(lm: dict[str, Any]) -> None:
    spec = bm.normalize_spec({"name": "mmlu", "source": "lm_eval", "task": lm["task"]})
    assert spec.metrics == ("acc", "acc_norm")  # from the task's metric_list
    rows = bm.load_examples(spec)
    adapter = HFAdapter(lm["model"])
    ours = {}
    for row in rows:
        gen = adapter.loglikelihood(row["prompt"], row["continuations"])
        ours[row["id"]] = (bm.score(spec, row, gen), gen.loglikelihoods)
    ref = lm["ref"]
    assert sorted(ours) == sorted(ref) and len(ref) == DOCS
    for doc_id, (scores, lls) in ours.items():
        assert scores["acc"] == ref[doc_id]["acc"], doc_id
        assert scores["acc_norm"] == ref[doc_id]["acc_norm"], doc_id
        assert lls == ref[doc_id]["lls"], doc_id  # the same numbers, not merely the same argmax
        assert json.loads(scores["loglikelihoods"]) == lls  # kept beside the scores
    # the two metrics disagree somewhere, so the comparison tests the length normalisation
    assert any(ours[d][0]["acc"] != ours[d][0]["acc_norm"] for d in ours)


def test_the_task_file_renders_as_lm_eval_renders_it(tmp_path: Path) -> None:
    rows = [{"q": "2+2?", "opts": ["3", "4"], "label": "4", "topic": "arithmetic"}]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "base.yaml").write_text(
        "output_type: multiple_choice\ndataset_path: json\n"
        f"dataset_kwargs: {{data_files: {{validation: {data.name}}}}}\n"  # beside the YAML
        "validation_split: validation\ntarget_delimiter: ' '\n"
    )
    (tmp_path / "t.yaml").write_text(
        'include: base.yaml\ntask: t\ndescription: "On {{topic}}.\\n"\n'
        "doc_to_text: \"Q: {{q | regex_replace('[?]', '')}}\\nA: \"\n"
        'doc_to_choice: "{{opts}}"\ndoc_to_target: label\n'
    )
    spec = bm.normalize_spec({"name": "t", "source": "lm_eval", "task": str(tmp_path / "t.yaml")})
    (ex,) = bm.load_examples(spec)
    assert ex["prompt"] == "On arithmetic.\nQ: 2+2\nA: "
    assert ex["choices"] == ["3", "4"] and ex["continuations"] == [" 3", " 4"]
    assert ex["gold"] == 1  # a target given as the choice's text
    assert spec.metrics == ("acc", "acc_norm")  # lm-eval's default for multiple_choice


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ("process_docs: !function utils.process_docs\n", "!function"),
        ("num_fewshot: 5\n", "num_fewshot 5"),
        ("filter_list: []\n", "filter_list"),
        ("metric_list: [{metric: exact_match}]\n", "'exact_match'"),
        ("unknown_field: 1\n", "'unknown_field'"),
    ],
)
def test_unsupported_task_features_are_refused_by_name(
    tmp_path: Path, extra: str, named: str
) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "task: t\noutput_type: multiple_choice\ndataset_path: json\ntest_split: test\n"
        "doc_to_text: q\ndoc_to_choice: c\ndoc_to_target: a\n" + extra
    )
    with pytest.raises(ConfigError, match=named.replace("!", "\\!")):
        load_task(str(path))


def test_generation_tasks_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("task: t\noutput_type: generate_until\ndataset_path: gsm8k\n")
    with pytest.raises(ConfigError, match="output_type: multiple_choice"):
        load_task(str(path))


def test_scores_follow_lm_evals_rules() -> None:
    ex = {"id": "0", "choices": ["a", "bbbb"], "gold": 1}
    # acc: the larger log-likelihood; acc_norm: per character (-4/4 > -2/1)
    assert choice_scores([-2.0, -4.0], ex, ["acc", "acc_norm"]) == {"acc": 0.0, "acc_norm": 1.0}
    # a tie goes to the first choice, as np.argmax
    assert choice_scores([-1.0, -1.0], ex, ["acc"]) == {"acc": 0.0}
    # several right answers; an out-of-range gold (-100) is never right
    assert choice_scores([-1.0, -2.0], {**ex, "gold": [0, 1]}, ["acc"]) == {"acc": 1.0}
    assert choice_scores([-1.0, -2.0], {**ex, "gold": -100}, ["acc"]) == {"acc": 0.0}


def test_an_inline_multiple_choice_benchmark_is_scored_the_same_way() -> None:
    raw = {
        "name": "mc",
        "source": "inline",
        "metrics": ["acc", "acc_norm"],
        "examples": [{"prompt": "Sky?", "choices": ["blue", "green"], "gold": 0}],
    }
    spec = bm.normalize_spec(raw)
    (ex,) = bm.load_examples(spec)
    assert ex["continuations"] == [" blue", " green"]
    gen = Generation([], loglikelihoods=[-5.0, -5.5])  # per character: -1.0 vs -0.92
    assert bm.score(spec, ex, gen)["acc"] == 1.0 and bm.score(spec, ex, gen)["acc_norm"] == 0.0
    with pytest.raises(ConfigError, match="choices"):
        bm.load_examples(
            bm.normalize_spec({**raw, "examples": [{"prompt": "Sky?", "answer": "blue"}]})
        )


@pytest.mark.e2e
def test_trailing_space_of_the_context_moves_to_the_continuation(lm: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(lm["model"])
    ctx, cont = encode_pair(tok, "Answer: ", "Paris")
    assert ctx == tok.encode("Answer:") and ctx + cont == tok.encode("Answer: Paris")


def test_an_echo_answer_scores_the_tokens_past_the_context() -> None:
    top = [None, {":": -0.5}, {" no": -0.1, " yes": -1.25}]  # " no" was likelier: not greedy
    choice = {"logprobs": {"tokens": ["Q", ":", " yes"], "token_logprobs": [None, -0.5, -1.25],
                           "text_offset": [0, 1, 2], "top_logprobs": top}}  # fmt: skip
    assert echo_loglikelihood(choice, len("Q:")) == (-1.25, False)
    with pytest.raises(AdapterError, match="text_offset"):
        echo_loglikelihood({"logprobs": {"tokens": ["a"]}}, 0)


@pytest.mark.e2e
def test_the_cli_and_http_path_evaluate_a_task_and_reuse_the_result(
    lm: dict[str, Any], tmp_path: Path
) -> None:
    srv = Server(str(tmp_path / "data"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "3600"}).start()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    adapter = json.dumps({"kind": "hf", "path": lm["model"]})
    cmd = [sys.executable, "-m", "fleetlens", "eval", "lm-eval", lm["task"], "--adapter", adapter,
           "--shard-size", "20", "--server", srv.url, "--json"]  # fmt: skip
    worker = start_worker(srv, "--idle-exit", "5", "--poll-s", "0.05", "--preload-adapter",
                          adapter, env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        ev = wait_for(srv, json.loads(out.stdout)["evaluationId"], 120)
        assert ev["state"] == "COMPLETED", ev["error"]
        ref = lm["ref"]
        for metric in ("acc", "acc_norm"):
            want = sum(r[metric] for r in ref.values()) / len(ref)
            assert ev["metrics"][TASK][metric]["mean"] == pytest.approx(want, abs=1e-12)
        rows = srv.get(f"/v1/evaluations/{ev['evaluationId']}/examples")["examples"]
        acc = {r["exampleId"]: r for r in rows if r["metric"] == "acc"}
        assert {k: v["value"] for k, v in acc.items()} == {k: r["acc"] for k, r in ref.items()}
        assert json.loads(acc["0"]["loglikelihoods"]) == ref["0"]["lls"]  # provenance of the choice
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert again.returncode == 0, again.stderr
        hit = json.loads(again.stdout)
        assert hit["cacheHit"] and hit["state"] == "COMPLETED"
        assert hit["metrics"] == ev["metrics"]
        bad = tmp_path / "bad.yaml"
        bad.write_text(Path(lm["task"]).read_text() + "process_docs: !function utils.docs\n")
        body = {"adapter": {"kind": "hf", "path": lm["model"]}, "suite": {"name": "s",
                "version": "1", "benchmarks": [{"name": "b", "source": "lm_eval",
                                                "task": str(bad)}]}}  # fmt: skip
        status, err = srv.request("POST", "/v1/evaluations", body)
        assert status == 400 and "!function" in json.dumps(err), err
    finally:
        worker.terminate()
        worker.wait(10)
        srv.stop()
