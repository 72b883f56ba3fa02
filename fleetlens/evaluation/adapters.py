"""Model adapters: how a worker asks a model for completions.

Three kinds behind one narrow protocol, chosen by a JSON spec that travels with the evaluation:

- ``{"kind": "callable", "target": "package.module:function"}``: a Python function
  ``f(prompt, *, n, decoding, example_id) -> list[str]`` (or a list of
  ``{"text", "logprobs"}``), imported in the worker;
- ``{"kind": "openai", "baseUrl": "http://host:port", "model": "name"}``: an OpenAI-compatible
  ``POST /v1/completions`` endpoint;
- ``{"kind": "hf", "path": "/dir/of/checkpoint"}``: a local Hugging Face causal LM, only where
  ``transformers`` is importable.

The decoding configuration is explicit (:class:`Decoding`), normalised, and recorded with every
result.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypedDict

from ..errors import AdapterError, ConfigError
from .doc_types import AdapterSpec, CallableAnswer

__all__ = ["ADAPTER_KINDS", "Adapter", "Decoding", "Generation", "adapter_from_spec"]

ADAPTER_KINDS = ("callable", "openai", "hf")


@dataclass(frozen=True)
class Decoding:
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int = 0
    logprobs: bool = False

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> Decoding:
        d = dict(d or {})
        unknown = set(d) - {f.name for f in cls.__dataclass_fields__.values()}
        if unknown:
            raise ConfigError(
                f"unknown decoding field(s) {sorted(unknown)}; use temperature, top_p, "
                "max_tokens, n, stop, seed, logprobs"
            )
        for name, kinds in _DECODING_TYPES.items():
            value = d.get(name)
            if name in d and (
                isinstance(value, bool) != (kinds == (bool,)) or not isinstance(value, kinds)
            ):
                raise ConfigError(
                    f"decoding field {name} is {value!r}; it must be "
                    + " or ".join(k.__name__ for k in kinds)
                )
        stop = d.get("stop") or []
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise ConfigError(f"decoding field stop is {stop!r}; it must be a list of strings")
        floats: dict[str, Any] = {k: float(d[k]) for k in ("temperature", "top_p") if k in d}
        out = cls(**{**d, **floats, "stop": tuple(stop)})
        if out.n < 1 or out.max_tokens < 1 or out.temperature < 0:
            raise ConfigError(f"decoding {d} is invalid: n >= 1, max_tokens >= 1, temperature >= 0")
        return out

    def as_json(self) -> DecodingJson:
        out = asdict(self)
        return DecodingJson(
            temperature=out["temperature"],
            top_p=out["top_p"],
            max_tokens=out["max_tokens"],
            n=out["n"],
            stop=list(self.stop),
            seed=out["seed"],
            logprobs=out["logprobs"],
        )


class DecodingJson(TypedDict):
    """A :class:`Decoding` as evaluations record it."""

    temperature: float
    top_p: float
    max_tokens: int
    n: int
    stop: list[str]
    seed: int
    logprobs: bool


_DECODING_TYPES: dict[str, tuple[type, ...]] = {
    "temperature": (int, float),
    "top_p": (int, float),
    "max_tokens": (int,),
    "n": (int,),
    "seed": (int,),
    "logprobs": (bool,),
}
"""The JSON types of :class:`Decoding`'s fields (``stop``: a list of strings); a bool is not
a number here."""


@dataclass
class Generation:
    texts: list[str]
    logprobs: list[list[float]] = field(default_factory=list)  # per text, per token
    # What the model counted (OpenAI's ``usage``, the tokenizer's ids); None: it did not say,
    # and the worker counts whitespace-separated words instead (and says so: ``tokens_counted``).
    tokens_in: int | None = None
    tokens_out: int | None = None
    # Multiple choice: per continuation, its log-likelihood given the prompt and whether greedy
    # decoding would produce it.
    loglikelihoods: list[float] = field(default_factory=list)
    greedy: list[bool] = field(default_factory=list)


class Adapter(Protocol):
    def generate(
        self, prompt: str, decoding: Decoding, example_id: str
    ) -> Generation: ...  # pragma: no cover


class ScoresContinuations(Protocol):
    """An adapter that can also score continuations (multiple-choice benchmarks)."""

    def loglikelihood(
        self, context: str, continuations: list[str]
    ) -> Generation: ...  # pragma: no cover


class CallableAdapter:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    def generate(self, prompt: str, decoding: Decoding, example_id: str) -> Generation:
        raw = self._fn(prompt, n=decoding.n, decoding=decoding, example_id=example_id)
        if isinstance(raw, str):
            raw = [raw]
        texts: list[str] = []
        logprobs: list[list[float]] = []
        tin: int | None = None
        tout: int | None = None
        for item in raw:
            if isinstance(item, dict):
                answer = CallableAnswer.model_validate(item)
                texts.append(str(answer.text))
                logprobs.append(list(answer.logprobs or []))
                if answer.tokens_in is not None:
                    tin = answer.tokens_in
                if answer.tokens_out is not None:
                    tout = (tout or 0) + answer.tokens_out
            else:
                texts.append(str(item))
        return Generation(texts, logprobs if any(logprobs) else [], tin, tout)


class OpenAIAdapter:
    """``POST {baseUrl}/v1/completions`` with one keep-alive connection per worker."""

    def __init__(
        self, base_url: str, model: str, timeout_s: float = 60.0, api_key: str = ""
    ) -> None:
        import httpx

        self._url = base_url.rstrip("/") + "/v1/completions"
        self._model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers)

    def close(self) -> None:
        self._client.close()

    def generate(self, prompt: str, decoding: Decoding, example_id: str) -> Generation:
        import httpx

        body: dict[str, Any] = {
            "model": self._model,
            "prompt": prompt,
            "n": decoding.n,
            "temperature": decoding.temperature,
            "top_p": decoding.top_p,
            "max_tokens": decoding.max_tokens,
            "seed": decoding.seed,
        }
        if decoding.stop:
            body["stop"] = list(decoding.stop)
        if decoding.logprobs:
            body["logprobs"] = 1
        try:
            r = self._client.post(self._url, json=body)
            r.raise_for_status()
            doc = r.json()
            choices = sorted(doc["choices"], key=lambda c: int(c.get("index", 0)))
            usage = doc.get("usage") or {}
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise AdapterError(f"completion endpoint {self._url} failed: {exc}") from exc
        texts = [str(c.get("text", "")) for c in choices]
        lps = [
            [
                float(x)
                for x in (c.get("logprobs") or {}).get("token_logprobs") or []
                if x is not None
            ]
            for c in choices
        ]
        tin, tout = usage.get("prompt_tokens"), usage.get("completion_tokens")
        return Generation(
            texts,
            lps if any(lps) else [],
            int(tin) if isinstance(tin, int) else None,
            int(tout) if isinstance(tout, int) else None,
        )

    def loglikelihood(self, context: str, continuations: list[str]) -> Generation:
        """One request for all the choices: ``prompt`` a list, ``echo`` with ``logprobs``."""
        import httpx

        from .loglikelihood import echo_loglikelihood

        body = {
            "model": self._model,
            "prompt": [context + c for c in continuations],
            "max_tokens": 0,
            "echo": True,
            "logprobs": 1,
            "temperature": 0.0,
        }
        try:
            r = self._client.post(self._url, json=body)
            r.raise_for_status()
            doc = r.json()
            choices = sorted(doc["choices"], key=lambda c: int(c.get("index", 0)))
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise AdapterError(f"completion endpoint {self._url} failed: {exc}") from exc
        if len(choices) != len(continuations):
            raise AdapterError(
                f"completion endpoint {self._url} answered {len(choices)} choices for "
                f"{len(continuations)} prompts"
            )
        scored = [echo_loglikelihood(c, len(context)) for c in choices]
        tin = (doc.get("usage") or {}).get("prompt_tokens")
        return Generation(
            [],
            [],
            int(tin) if isinstance(tin, int) else None,
            0,
            [s[0] for s in scored],
            [s[1] for s in scored],
        )


class HFAdapter:
    """A local causal LM loaded from a directory; greedy when temperature is 0."""

    def __init__(self, path: str) -> None:
        try:
            import transformers  # type: ignore[import-not-found, unused-ignore]
        except ImportError as exc:
            raise ConfigError(
                "adapter kind 'hf' needs the transformers package: pip install transformers torch"
            ) from exc
        if not os.path.isdir(path):
            raise ConfigError(f"hf adapter path {path!r} is not a directory of a checkpoint")
        self._tok = transformers.AutoTokenizer.from_pretrained(path)
        self._model = transformers.AutoModelForCausalLM.from_pretrained(path)
        self._model.eval()

    def generate(self, prompt: str, decoding: Decoding, example_id: str) -> Generation:
        import torch

        torch.manual_seed(decoding.seed)
        ids = self._tok(prompt, return_tensors="pt")
        sample = decoding.temperature > 0
        kwargs: dict[str, Any] = {
            "max_new_tokens": decoding.max_tokens,
            "do_sample": sample,
            "num_return_sequences": decoding.n,
            "pad_token_id": self._tok.eos_token_id,
            "output_scores": decoding.logprobs,
            "return_dict_in_generate": True,
        }
        if sample:
            kwargs.update(temperature=decoding.temperature, top_p=decoding.top_p)
        with torch.no_grad():
            out = self._model.generate(**ids, **kwargs)
        start = ids["input_ids"].shape[1]
        texts = [self._tok.decode(seq[start:], skip_special_tokens=True) for seq in out.sequences]
        for s in decoding.stop:
            texts = [t.split(s, 1)[0] for t in texts]
        logprobs: list[list[float]] = []
        if decoding.logprobs:
            scores = self._model.compute_transition_scores(
                out.sequences, out.scores, normalize_logits=True
            )
            logprobs = [[float(x) for x in row] for row in scores]
        tout = sum(len(seq) - start for seq in out.sequences)
        return Generation(texts, logprobs, int(start), int(tout))

    def loglikelihood(self, context: str, continuations: list[str]) -> Generation:
        """Each continuation's summed log-probability given the context, computed as
        lm-evaluation-harness's HFLM computes it (one unpadded sequence per continuation)."""
        import torch

        from .loglikelihood import encode_pair, max_length

        lls: list[float] = []
        greedy: list[bool] = []
        limit = max_length(self._model.config, self._tok)
        tokens = 0
        for cont in continuations:
            ctx_enc, cont_enc = encode_pair(self._tok, context, cont)
            inp = torch.tensor([(ctx_enc + cont_enc)[-(limit + 1) :][:-1]], dtype=torch.long)
            inplen, contlen = inp.shape[1], len(cont_enc)
            tokens += inplen
            with torch.no_grad():
                logits = torch.nn.functional.log_softmax(self._model(inp).logits, dim=-1)[0]
            sel = logits[inplen - contlen : inplen].unsqueeze(0)
            want = torch.tensor(cont_enc, dtype=torch.long).unsqueeze(0)
            greedy.append(bool((sel.argmax(dim=-1) == want).all()))
            lls.append(float(torch.gather(sel, 2, want.unsqueeze(-1)).squeeze(-1).sum()))
        return Generation([], [], tokens, 0, lls, greedy)


def adapter_from_spec(spec: dict[str, Any]) -> Adapter:
    a = AdapterSpec.of(spec)
    if a.kind == "callable":
        module, _, attr = a.target.partition(":")
        if not module or not attr:
            raise ConfigError(f"callable adapter target {a.target!r} must be 'package.module:name'")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot import callable adapter {a.target!r}: {exc}") from exc
        return CallableAdapter(fn)
    if a.kind == "openai":
        if not a.base_url:
            raise ConfigError("openai adapter needs baseUrl, e.g. http://127.0.0.1:8000")
        key = os.environ.get(a.api_key_env, "") if a.api_key_env else ""
        return OpenAIAdapter(a.base_url, a.model, api_key=key)
    if a.kind == "hf":
        return HFAdapter(a.path)
    raise ConfigError(f"adapter kind {a.kind!r} is unknown; use one of {', '.join(ADAPTER_KINDS)}")


def validate_spec(spec: dict[str, Any]) -> None:
    """Check a spec's shape on the server (without importing or connecting)."""
    a = AdapterSpec.of(spec)
    if a.kind not in ADAPTER_KINDS:
        raise ConfigError(
            f"adapter kind {a.kind!r} is unknown; use one of {', '.join(ADAPTER_KINDS)}"
        )
    required = {"callable": "target", "openai": "base_url", "hf": "path"}[str(a.kind)]
    if not getattr(a, required):
        key = AdapterSpec.model_fields[required].alias
        raise ConfigError(f"adapter kind {a.kind!r} needs {key!r}")
