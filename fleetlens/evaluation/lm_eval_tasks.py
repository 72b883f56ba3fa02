"""lm-evaluation-harness task definitions (YAML) as fleetlens benchmarks, scored as lm-eval does.

A benchmark ``{"name": "mmlu", "source": "lm_eval", "task": "/path/to/task.yaml"}`` reads the
task file on the server, loads its documents with ``datasets.load_dataset(dataset_path,
dataset_name, **dataset_kwargs)`` exactly as lm-eval does (a hub dataset where a hub can be
reached; ``dataset_path: json`` with ``dataset_kwargs: {data_files: ...}`` for local files) and
renders each document of the evaluation split into an example::

    {"id": "<doc index>", "prompt": context, "choices": [...],
     "continuations": [target_delimiter + choice, ...], "gold": index | [indices]}

The context is lm-eval's zero-shot plain-text context (``description`` + ``doc_to_text``);
``doc_to_text``/``doc_to_choice``/``doc_to_target`` are field names or Jinja templates rendered
with lm-eval's rules (StrictUndefined, ``regex_replace``; here in Jinja's sandbox, since the
task file comes from a user). A worker asks the model for the log-likelihood of every
continuation given the context, and :func:`choice_scores` turns them into ``acc`` (argmax of
the log-likelihoods), ``acc_norm`` (argmax of log-likelihood / the choice's length in
characters) and ``acc_bytes`` (/ its length in UTF-8 bytes): lm_eval/api/task.py's
``process_results`` for ``multiple_choice``, ties going to the first choice as ``np.argmax``.

What lm-eval features need Python from the task's folder (``!function``), few-shot examples,
chat templates or other output types is refused with the feature's name: it is not guessed.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from ..errors import ConfigError
from .example_types import Example

__all__ = ["MC_METRICS", "TaskConfig", "choice_scores", "load_task", "task_examples"]

MC_METRICS = ("acc", "acc_norm", "acc_bytes")
# Fields that only name, describe or tune lm-eval's own bookkeeping: read and ignored.
_IGNORED = {"task", "tag", "group", "task_alias", "group_alias", "metadata", "dataset_name",
            "dataset_path", "dataset_kwargs", "test_split", "validation_split",
            "training_split", "fewshot_split", "output_type", "doc_to_text", "doc_to_choice",
            "doc_to_target", "target_delimiter", "fewshot_delimiter", "metric_list",
            "description", "should_decontaminate", "doc_to_decontamination_query",
            "num_fewshot", "fewshot_config", "include", "repeats", "unsafe_code"}  # fmt: skip
_UNSUPPORTED = {
    "process_docs": "process_docs (Python run on the documents)",
    "process_results": "process_results (Python scoring)",
    "filter_list": "filter_list (answer extraction for generated text)",
    "gen_prefix": "gen_prefix",
    "doc_to_image": "doc_to_image (multimodal input)",
    "doc_to_audio": "doc_to_audio (multimodal input)",
    "use_prompt": "use_prompt (promptsource templates)",
    "custom_dataset": "custom_dataset (Python)",
    "generation_kwargs": "generation_kwargs (generated answers)",
}


class _Function(str):
    """A ``!function module.name`` tag: Python from the task's folder, which fleetlens does not
    import."""


class _TaskLoader(yaml.SafeLoader):  # type: ignore[misc]
    pass


def _function(loader: Any, node: Any) -> _Function:
    return _Function(loader.construct_scalar(node))


_TaskLoader.add_constructor("!function", _function)


@dataclass(frozen=True)
class _TaskFile:
    """A task file's mapping as written, the files it includes merged in (not yet checked)."""

    fields: dict[str, Any]


@dataclass(frozen=True)
class TaskConfig:
    """What fleetlens reads of an lm-eval task file: where its documents are, how one becomes
    an example (``doc_to_*``: a field name, a Jinja template or a literal) and its metrics."""

    dir: str  # the task file's folder: relative data files are looked for there
    dataset_path: str
    dataset_name: str | None
    dataset_kwargs: dict[str, Any]
    split: str  # test_split, else validation_split (empty: neither)
    doc_to_text: Any
    doc_to_choice: Any
    doc_to_target: Any
    description: Any
    target_delimiter: str
    metrics: list[str]


def _read(path: str, seen: tuple[str, ...] = ()) -> _TaskFile:
    if path in seen:
        raise ConfigError(f"lm-eval task {path!r} includes itself (through {list(seen)})")
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.load(fh, Loader=_TaskLoader)  # a SafeLoader with one tag more
    except OSError as exc:
        raise ConfigError(f"cannot read lm-eval task file {path!r}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"lm-eval task file {path!r} is not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"lm-eval task file {path!r} is not a mapping of task fields")
    base = doc.get("include")
    if base:  # lm-eval: the included file's fields, overridden by this file's
        inc = str(base) if os.path.isabs(str(base)) else os.path.join(os.path.dirname(path), base)
        doc = {
            **_read(inc, (*seen, path)).fields,
            **{k: v for k, v in doc.items() if k != "include"},
        }
    return _TaskFile(doc)


def load_task(path: str) -> TaskConfig:
    """A task file's fields (``include`` resolved), refusing what fleetlens cannot run."""
    cfg = _read(os.path.abspath(path)).fields
    for key, value in cfg.items():
        if isinstance(value, _Function):
            raise ConfigError(
                f"lm-eval task {path!r}: {key}: !function {value} runs Python from the task's "
                "folder, which fleetlens does not import; use a field name or a Jinja template"
            )
        if key in _UNSUPPORTED:
            raise ConfigError(
                f"lm-eval task {path!r} uses {_UNSUPPORTED[key]}, which fleetlens does not "
                "support; supported: multiple_choice tasks with doc_to_text/doc_to_choice/"
                "doc_to_target as field names or Jinja templates, zero-shot"
            )
        if key not in _IGNORED and not key.startswith("_"):
            raise ConfigError(f"lm-eval task {path!r}: field {key!r} is not supported")
    if cfg.get("output_type", "generate_until") != "multiple_choice":
        raise ConfigError(
            f"lm-eval task {path!r} has output_type {cfg.get('output_type')!r}; fleetlens runs "
            "output_type: multiple_choice"
        )
    if int(cfg.get("num_fewshot") or 0) > 0:
        raise ConfigError(
            f"lm-eval task {path!r} asks for num_fewshot {cfg['num_fewshot']}; fleetlens runs "
            "lm-eval tasks zero-shot (num_fewshot: 0)"
        )
    for key in ("dataset_path", "doc_to_text", "doc_to_choice", "doc_to_target"):
        if cfg.get(key) is None:
            raise ConfigError(f"lm-eval task {path!r} has no {key}")
    metrics = metrics_of(cfg.get("metric_list"))
    for metric in metrics:
        if metric not in MC_METRICS:
            raise ConfigError(
                f"lm-eval task {path!r}: metric {metric!r} is not supported; use {MC_METRICS}"
            )
    return TaskConfig(
        dir=os.path.dirname(os.path.abspath(path)),
        dataset_path=cfg["dataset_path"],
        dataset_name=cfg.get("dataset_name"),
        dataset_kwargs=dict(cfg.get("dataset_kwargs") or {}),
        split=str(cfg.get("test_split") or cfg.get("validation_split") or ""),
        doc_to_text=cfg["doc_to_text"],
        doc_to_choice=cfg["doc_to_choice"],
        doc_to_target=cfg["doc_to_target"],
        description=cfg.get("description"),
        target_delimiter=str(cfg.get("target_delimiter", " ")),
        metrics=metrics,
    )


def metrics_of(metric_list: Any) -> list[str]:
    """The task's metric_list (lm-eval's default for multiple_choice: acc, acc_norm)."""
    entries = metric_list or [{"metric": "acc"}, {"metric": "acc_norm"}]
    out = []
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("metric"), str):
            raise ConfigError(f"metric_list entry {e!r} must be {{metric: name, ...}}")
        out.append(e["metric"])
    return out


def _regex_replace(string: str, pattern: str, repl: str, count: int = 0) -> str:
    return re.sub(pattern, repl, string, count=count)


def _environment() -> Any:
    try:
        from jinja2 import BaseLoader, StrictUndefined
        from jinja2.sandbox import SandboxedEnvironment
    except ImportError as exc:
        raise ConfigError("lm-eval task templates need jinja2: pip install jinja2") from exc
    env = SandboxedEnvironment(
        loader=BaseLoader(), undefined=StrictUndefined, keep_trailing_newline=True
    )
    env.filters["regex_replace"] = _regex_replace
    return env


class _Renderer:
    """lm-eval's ConfigurableTask.doc_to_* for field names and templates."""

    def __init__(self, cfg: TaskConfig, features: Sequence[str]) -> None:
        self.cfg = cfg
        self.features = set(features)
        self.env = _environment()
        self._templates: dict[str, Any] = {}

    def _render(self, template: str, doc: dict[str, Any]) -> str:
        from jinja2 import TemplateError

        try:
            t = self._templates.get(template)
            if t is None:
                t = self._templates[template] = self.env.from_string(template)
            return str(t.render(**doc))
        except TemplateError as exc:
            raise ConfigError(f"template {template!r} failed on a document: {exc}") from exc

    def text(self, doc: dict[str, Any]) -> Any:
        spec = self.cfg.doc_to_text
        if isinstance(spec, int):
            return spec
        if spec in self.features:
            return doc[spec]
        out = self._render(str(spec), doc)
        return ast.literal_eval(out) if out.isdigit() else out

    def target(self, doc: dict[str, Any]) -> Any:
        spec = self.cfg.doc_to_target
        if isinstance(spec, (int, list)):
            return spec
        if spec in self.features:
            return doc[spec]
        out = self._render(str(spec), doc)
        if out.isdigit():
            return ast.literal_eval(out)
        if len(out) >= 2 and out[0] == "[" and out[-1] == "]":
            try:
                return ast.literal_eval(out)
            except (SyntaxError, ValueError):
                return out
        return out

    def choices(self, doc: dict[str, Any]) -> list[str]:
        spec = self.cfg.doc_to_choice
        if isinstance(spec, list):
            return [str(c) for c in spec]
        if isinstance(spec, dict):
            return [str(c) for c in spec.values()]
        if spec in self.features:
            return list(doc[spec])
        try:
            out = ast.literal_eval(self._render(str(spec), doc))
        except (SyntaxError, ValueError) as exc:
            raise ConfigError(f"doc_to_choice {spec!r} does not render a list: {exc}") from exc
        return list(out)

    def description(self, doc: dict[str, Any]) -> str:
        spec = self.cfg.description
        if not spec:
            return ""
        return str(doc[spec]) if spec in doc else self._render(str(spec), doc)


def _data_files(value: Any, base: str) -> Any:
    """Relative data files as lm-eval reads them (from the working directory), else from the
    task file's folder."""
    if isinstance(value, dict):
        return {k: _data_files(v, base) for k, v in value.items()}
    if isinstance(value, list):
        return [_data_files(v, base) for v in value]
    path = str(value)
    if os.path.isabs(path) or os.path.exists(path) or "://" in path:
        return path
    return os.path.join(base, path)


@dataclass(frozen=True)
class _Documents:
    """The evaluation split of a task's dataset: its rows and the names of their fields."""

    rows: list[dict[str, Any]]  # the dataset's rows, as datasets loads them
    features: list[str]


def _documents(cfg: TaskConfig) -> _Documents:
    try:
        import datasets
    except ImportError as exc:
        raise ConfigError(
            "benchmark source 'lm_eval' loads data with the datasets package: pip install datasets"
        ) from exc
    kwargs = dict(cfg.dataset_kwargs)
    kwargs.pop("trust_remote_code", None)  # datasets >= 4 refuses it, as lm-eval drops it
    if "data_files" in kwargs:
        kwargs["data_files"] = _data_files(kwargs["data_files"], cfg.dir)
    split = cfg.split
    if not split:
        raise ConfigError("an lm-eval task needs test_split or validation_split")
    try:
        ds = datasets.load_dataset(path=cfg.dataset_path, name=cfg.dataset_name, **kwargs)
        docs = ds[split]
    except KeyError as exc:
        raise ConfigError(f"the task's dataset has no split {split!r}") from exc
    except Exception as exc:  # datasets raises many kinds (offline, missing file, bad format)
        raise ConfigError(
            f"cannot load dataset {cfg.dataset_path!r} ({kwargs}): {type(exc).__name__}: {exc}"
        ) from exc
    return _Documents([dict(d) for d in docs], list(docs.features.keys()))


def _gold(target: Any, choices: list[str]) -> int | list[int]:
    """lm-eval's gold index: an index, a choice's text, or a list of indices (-100: invalid)."""
    if isinstance(target, list):
        return [int(i) if int(i) < len(choices) else -100 for i in target]
    if not isinstance(target, (int, str)):  # a bool is an index, as in Python and lm-eval
        raise ConfigError(f"doc_to_target gave {target!r}; an index or a choice's text is needed")
    if isinstance(target, int):
        return target if target < len(choices) else -100
    return choices.index(target) if target in choices else -100


def task_examples(task: str) -> list[Example]:
    """The examples of the task file ``task``, one per document of the evaluation split."""
    cfg = load_task(task)
    found = _documents(cfg)
    docs = found.rows
    if not docs:
        raise ConfigError(f"lm-eval task {task!r} has no documents")
    r = _Renderer(cfg, found.features)
    delimiter = cfg.target_delimiter
    rows = []
    for i, doc in enumerate(docs):
        text = r.text(doc)
        if not isinstance(text, str):
            raise ConfigError(
                f"lm-eval task {task!r}: doc_to_text gave {text!r} for document "
                f"{i}; tasks with several contexts per document (multiple inputs) are not supported"
            )
        choices = [str(c) for c in r.choices(doc)]
        rows.append(
            Example(
                id=str(i),
                prompt=r.description(doc) + text,
                choices=list(choices),
                continuations=[delimiter + c for c in choices],
                gold=_gold(r.target(doc), choices),
            )
        )
    return rows


def _argmax(values: Sequence[float]) -> int:
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def choice_scores(
    loglikelihoods: Sequence[float], example: Example, metrics: Sequence[str]
) -> dict[str, float]:
    """acc / acc_norm / acc_bytes of one example from its choices' log-likelihoods."""
    choices = [str(c) for c in example["choices"]]
    if len(loglikelihoods) != len(choices):
        raise ConfigError(
            f"example {example.get('id')}: {len(loglikelihoods)} log-likelihoods for "
            f"{len(choices)} choices"
        )
    lls = [float(x) for x in loglikelihoods]
    preds = {
        "acc": _argmax(lls),
        "acc_norm": _argmax([ll / float(len(c)) for ll, c in zip(lls, choices, strict=True)]),
        "acc_bytes": _argmax(
            [ll / float(len(c.encode("utf-8"))) for ll, c in zip(lls, choices, strict=True)]
        ),
    }
    gold = example["gold"]
    golds = gold if isinstance(gold, list) else [gold]
    return {m: float(preds[m] in golds) for m in metrics if m in preds}
