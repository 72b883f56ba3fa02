"""Log-likelihood of a continuation given a context: the tokenization rules and the parsing of
an OpenAI-style ``echo`` answer that the multiple-choice adapters share.

The rules are lm-evaluation-harness's (``lm_eval/api/model.py`` ``_encode_pair`` and
``lm_eval/models/huggingface.py``), so that a score computed here is the score lm-eval computes
on the same model: whitespace at the end of the context moves to the start of the continuation;
the continuation's tokens are those of ``encode(context + continuation)`` past
``len(encode(context))``; an empty context is the model's BOS (else EOS) token; special tokens
follow the tokenizer's own default, except that a text starting with the BOS text gets none.
"""

from __future__ import annotations

from typing import Any

from ..errors import AdapterError

__all__ = ["DEFAULT_MAX_LENGTH", "echo_loglikelihood", "encode_pair", "max_length"]

DEFAULT_MAX_LENGTH = 2048  # lm-eval's, for a model whose config names no context length
_TOKENIZER_INFINITY = 1_000_000_000_000_000_019_884_624_838_656


def _prefix_token_id(tok: Any) -> int:
    bos = getattr(tok, "bos_token_id", None)
    return int(bos if bos is not None else tok.eos_token_id)


def _encode(tok: Any, text: str, special: bool | None = None) -> list[int]:
    kwargs: dict[str, Any] = {} if special is None else {"add_special_tokens": special}
    if special is None and text.startswith(str(tok.decode(_prefix_token_id(tok)))):
        kwargs["add_special_tokens"] = False
    return [int(t) for t in tok.encode(text, **kwargs)]


def encode_pair(tok: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The context's and the continuation's token ids, split as lm-eval splits them."""
    if context == "":
        cont = _encode(tok, continuation, special=False)
        prefix = _prefix_token_id(tok)
        return ([prefix], cont) if not cont or cont[0] != prefix else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = _encode(tok, context + continuation)
    ctx = _encode(tok, context)
    cont = whole[len(ctx) :]
    if not ctx or not cont:
        raise AdapterError(
            f"continuation {continuation!r} encodes to no tokens after context ending "
            f"{context[-40:]!r}; nothing to score"
        )
    return ctx, cont


def max_length(config: Any, tok: Any) -> int:
    """The model's context length: its config (the text model's first), else the tokenizer's."""
    for cfg in (getattr(config, "text_config", None), config):
        for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
            value = getattr(cfg, attr, None) if cfg is not None else None
            if isinstance(value, int) and value > 0:
                return value
    limit = getattr(tok, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < _TOKENIZER_INFINITY:
        return limit
    return DEFAULT_MAX_LENGTH


def echo_loglikelihood(choice: dict[str, Any], context_chars: int) -> tuple[float, bool]:
    """The continuation's log-likelihood and greediness from one choice of a completions answer
    to ``prompt = context + continuation, echo: true, max_tokens: 0, logprobs: 1``: the tokens
    that end past the context's ``context_chars`` characters (``text_offset``)."""
    lp = choice.get("logprobs") or {}
    tokens = lp.get("tokens") or []
    values = lp.get("token_logprobs") or []
    offsets = lp.get("text_offset") or []
    top = lp.get("top_logprobs") or [None] * len(tokens)
    if not (len(tokens) == len(values) == len(offsets) == len(top)) or not tokens:
        raise AdapterError(
            "the endpoint's echo answer needs logprobs.tokens, token_logprobs and text_offset "
            "of equal length (OpenAI completions with echo: true, logprobs: 1)"
        )
    total, greedy, seen = 0.0, True, False
    for token, value, offset, alts in zip(tokens, values, offsets, top, strict=True):
        if int(offset) + len(str(token)) <= context_chars:
            continue
        if value is None:
            raise AdapterError(f"the endpoint gave no log-probability for token {token!r}")
        seen = True
        total += float(value)
        if alts:
            greedy = greedy and max(alts.items(), key=lambda kv: float(kv[1]))[0] == token
    if not seen:
        raise AdapterError("the endpoint's echo answer has no token past the context")
    return total, greedy
