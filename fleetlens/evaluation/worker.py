"""A stateless evaluation worker: lease a shard through the API, run it, report, repeat.

Everything a shard needs (examples, benchmark spec, adapter spec, decoding) comes with the lease,
so any number of workers on any machine can serve one server. While a shard runs, a background
thread heartbeats (extending the lease and sending the per-example results so far); if the
server answers that the lease is gone (it expired and another worker has the shard), the worker
drops the shard. An error in the model or the scorer is reported as a failed attempt, and the
server retries that shard alone.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..client import Client
from ..errors import AdapterError, APIError, FleetlensError
from .adapters import Adapter, Decoding, Generation, ScoresContinuations, adapter_from_spec
from .benchmarks import is_multiple_choice, render, score
from .cache import canonical_hash
from .doc_types import BenchmarkSpec, Doc
from .example_types import Example
from .worker_types import CompleteAsk, FailAsk, HeartbeatAsk, LeaseAsk, LeasedShard

__all__ = ["Worker", "WorkerConfig", "usage"]

log = logging.getLogger("fleetlens.eval.worker")


@dataclass(frozen=True)
class WorkerConfig:
    """Server and token as :class:`fleetlens.client.Client` resolves them (None: environment)."""

    server: str | None = None
    token: str | None = None
    worker_id: str = ""
    lease_s: float = 30.0
    poll_s: float = 0.5
    idle_exit_s: float | None = None  # stop after this long with nothing to lease
    max_shards: int | None = None
    # adapters built before the first lease (a worker pool serving one model loads it once)
    preload: tuple[dict[str, Any], ...] = ()


def usage(prompt: str, gen: Generation, wall_ms: float) -> dict[str, float]:
    """One example's cost inputs: the model call's wall time and its tokens in and out (the
    model's own counts; without them, whitespace-separated words, flagged ``tokens_counted``)."""
    out = {"latency_ms": wall_ms}
    if gen.tokens_in is None or gen.tokens_out is None:
        out["tokens_counted"] = 1.0
    out["tokens_in"] = float(gen.tokens_in if gen.tokens_in is not None else len(prompt.split()))
    out["tokens_out"] = float(
        gen.tokens_out if gen.tokens_out is not None else sum(len(t.split()) for t in gen.texts)
    )
    return out


SHOWN_CHARS = 4000
"""The most of an example's prompt, output and reference kept for the evaluation page."""


def shown(spec: BenchmarkSpec, example: Example, prompt: str, gen: Generation) -> dict[str, str]:
    """What the model was asked (the rendered prompt), what it answered (its first sample; for a
    multiple-choice example, the choice it ranked first) and what was expected, as texts kept
    beside the scores."""
    if is_multiple_choice(spec) and example.get("choices"):
        choices = [str(c) for c in example["choices"]]
        lls = list(gen.loglikelihoods or [])
        ranked = len(lls) == len(choices)
        output = choices[max(range(len(lls)), key=lls.__getitem__)] if ranked else ""
        gold = example.get("gold")
        golds = gold if isinstance(gold, list) else [gold]
        ok = [g for g in golds if isinstance(g, int) and 0 <= g < len(choices)]
        reference = " | ".join(choices[g] for g in ok)
    else:
        output = gen.texts[0] if gen.texts else ""
        refs = example.get("answers") or [example.get("answer", "")]
        reference = " | ".join(str(r) for r in refs if r != "")
    return {
        "prompt": prompt[:SHOWN_CHARS],
        "output": output[:SHOWN_CHARS],
        "reference": reference[:SHOWN_CHARS],
    }


def _scorer(adapter: Adapter, spec: dict[str, Any]) -> ScoresContinuations:
    """The adapter as a scorer of continuations; ``spec``: the adapter's own spec."""
    if not hasattr(adapter, "loglikelihood"):
        raise AdapterError(
            f"adapter kind {spec.get('kind')!r} cannot score continuations, which a "
            "multiple-choice benchmark needs; use kind hf or openai (echo + logprobs)"
        )
    return adapter  # type: ignore[return-value]


class _LeaseGone(FleetlensError):
    pass


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.worker_id = config.worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self._client = Client(config.server, config.token, timeout=60)
        self._adapters: dict[str, Adapter] = {}
        self._locality = ""
        self.shards_done = 0

    def close(self) -> None:
        for adapter in self._adapters.values():
            close = getattr(adapter, "close", None)
            if close is not None:
                close()
        self._client.close()

    def _post(self, path: str, body: Doc) -> Any:
        """POST ``body``; the lease being gone (HTTP 409) is :class:`_LeaseGone`."""
        try:
            return self._client.post(path, body.as_json())
        except APIError as exc:
            if exc.status == 409:
                raise _LeaseGone(exc.message) from exc
            raise

    def lease(self) -> LeasedShard | None:
        body = LeaseAsk(
            worker_id=self.worker_id, prefer_locality=self._locality, lease_s=self.config.lease_s
        )
        shard = self._post("/v1/eval-shards/lease", body)
        return LeasedShard.model_validate(shard) if shard else None

    def preload(self) -> None:
        for spec in self.config.preload:
            self._adapter(spec)

    def run(self) -> int:
        """Serve shards until idle for ``idle_exit_s`` (or forever); returns shards completed."""
        idle_since = time.monotonic()
        while self.config.max_shards is None or self.shards_done < self.config.max_shards:
            shard = self.lease()
            if shard is None:
                if (
                    self.config.idle_exit_s is not None
                    and time.monotonic() - idle_since > self.config.idle_exit_s
                ):
                    break
                time.sleep(self.config.poll_s)
                continue
            self.run_shard(shard)
            idle_since = time.monotonic()
        return self.shards_done

    def _adapter(self, spec: dict[str, Any]) -> Adapter:
        key = canonical_hash(spec)
        if key not in self._adapters:
            self._adapters[key] = adapter_from_spec(spec)
        return self._adapters[key]

    def run_shard(self, shard: LeasedShard) -> None:
        sid, token = shard.shard_id, shard.lease_token
        scores: dict[str, dict[str, float | str]] = {}
        lock = threading.Lock()
        stop = threading.Event()
        lost = threading.Event()

        def beat() -> None:
            sent = 0
            while not stop.wait(self.config.lease_s / 3):
                with lock:
                    partial = dict(scores) if len(scores) > sent else None
                    sent = len(scores)
                try:
                    self._post(
                        f"/v1/eval-shards/{sid}/heartbeat",
                        HeartbeatAsk(
                            lease_token=token, lease_s=self.config.lease_s, partial=partial
                        ),
                    )
                except _LeaseGone:
                    lost.set()
                    return
                except Exception as exc:  # a missed beat is retried; the lease has slack
                    log.warning("heartbeat of shard %s failed: %s", sid, exc)

        thread = threading.Thread(target=beat, name=f"heartbeat-{sid}", daemon=True)
        thread.start()
        try:
            adapter = self._adapter(shard.adapter)
            self._locality = shard.locality
            decoding = Decoding.from_json(shard.decoding)
            spec = shard.benchmark_spec()
            skip = set(shard.completed_ids)
            for ex in shard.examples_read():
                if lost.is_set():
                    raise _LeaseGone(f"shard {sid} was leased to another worker")
                if ex["id"] in skip:
                    continue
                prompt = render(spec, ex)
                t0 = time.perf_counter()
                if is_multiple_choice(spec):
                    gen = _scorer(adapter, shard.adapter).loglikelihood(
                        prompt, list(ex["continuations"])
                    )
                else:
                    gen = adapter.generate(prompt, decoding, str(ex["id"]))
                wall_ms = (time.perf_counter() - t0) * 1000.0
                result = {
                    **score(spec, ex, gen),
                    **usage(prompt, gen, wall_ms),
                    **shown(spec, ex, prompt, gen),
                }
                with lock:
                    scores[str(ex["id"])] = result
            stop.set()
            thread.join()
            with lock:
                final = dict(scores)
            self._post(
                f"/v1/eval-shards/{sid}/complete", CompleteAsk(lease_token=token, scores=final)
            )
            self.shards_done += 1
        except _LeaseGone as exc:
            log.warning("dropped shard %s: %s", sid, exc)
        except Exception as exc:
            log.warning("shard %s failed: %s", sid, exc)
            stop.set()
            try:
                self._post(
                    f"/v1/eval-shards/{sid}/fail",
                    FailAsk(lease_token=token, error=f"{type(exc).__name__}: {exc}"),
                )
            except FleetlensError as exc2:
                log.warning("could not report the failure of shard %s: %s", sid, exc2)
        finally:
            stop.set()
            thread.join()
