"""A load generator that costs its target almost nothing to tell apart from real senders.

It replays request bodies over raw HTTP/1.1 keep-alive connections from one asyncio loop (no
client library: a request is one ``write`` and a response one header parse), each connection
one sender at a time as a rank's SDK or a node's relay is. A 429 or a 503 is retried after the
server's Retry-After, a broken connection after reconnecting, with the same bytes: nothing is
dropped on the way, so what the server did not store it refused or never got to.

:class:`Plan` says what to send when; :func:`drive` sends it and returns what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from fleetlens.wire import BatchFrame, encode_frames

__all__ = ["Outcome", "Plan", "Request", "drive"]


@dataclass(frozen=True)
class Request:
    """One request: its path, headers and body, its sender (a connection serves one sender at
    a time, in order), what it carries (rank-steps) and when it is due (seconds from start)."""

    path: str
    headers: dict[str, str]
    body: bytes
    sender: int
    rank_steps: int
    due: float
    frames: tuple[BatchFrame, ...] = ()  # a relay's request: its frames, each answered alone


_RETRY = (408, 413, 429, 500, 502, 503, 504)


@dataclass
class Plan:
    """What to send: ``second(k)`` makes second ``k``'s requests (made as they fall due, so
    that a long run does not hold them all), ``seconds`` of them."""

    second: Callable[[int], list[Request]]
    seconds: int
    connections: int


@dataclass
class Outcome:
    """What the sending saw: per request its latency (due to answered 200), the rank-steps
    acknowledged and when, the retries and the sender's own lag behind its schedule."""

    latencies: list[float] = field(default_factory=list)
    acked_rank_steps: int = 0
    acked_at: list[tuple[float, int]] = field(default_factory=list)  # (seconds, rank-steps)
    retries: int = 0
    refused: dict[int, int] = field(default_factory=dict)  # status -> answers (retried)
    errors: int = 0  # permanent refusals (4xx other than 408, 413, 429): not retried
    lag_s: list[float] = field(default_factory=list)  # per request, how late it was sent
    requests: int = 0

    def acked_by(self, t: float) -> int:
        """Rank-steps acknowledged within ``t`` seconds of the start."""
        return sum(n for at, n in self.acked_at if at <= t)


class _Conn:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, req: Request) -> tuple[int, float | None, bytes]:
        """Send one request; (status, Retry-After seconds, body) of its answer."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = [f"POST {req.path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        head += [f"{k}: {v}" for k, v in req.headers.items()]
        head.append(f"Content-Length: {len(req.body)}")
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + req.body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, retry, close = 0, None, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "retry-after":
                with contextlib.suppress(ValueError):
                    retry = float(value)
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        body = await self.reader.readexactly(length) if length else b""
        if close:
            self.close()
        return status, retry, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _sender(
    conn: _Conn, queue: asyncio.Queue[Request | None], out: Outcome, t0: float
) -> None:
    while (req := await queue.get()) is not None:
        while True:
            try:
                status, retry, answer = await conn.request(req)
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                conn.close()
                out.retries += 1
                await asyncio.sleep(0.5)
                continue
            if status == 200 and req.frames:  # each frame answered alone: resend the refused
                try:
                    results = json.loads(answer).get("results")
                except ValueError:
                    results = None
                results = results or [{"status": 200}] * len(req.frames)  # (the bare app's)
                codes = [r["status"] for r in results]
                again = [f for f, c in zip(req.frames, codes, strict=True) if c in _RETRY]
                out.errors += sum(c != 200 and c not in _RETRY for c in codes)
                ok = sum(c == 200 for c in codes)
                done = req.rank_steps * ok // len(req.frames)
                now = time.monotonic() - t0
                out.acked_rank_steps += done
                out.acked_at.append((now, done))
                if not again:
                    out.latencies.append(now - req.due)
                    break
                out.refused[429] = out.refused.get(429, 0) + len(again)
                out.retries += 1
                per = req.rank_steps // len(req.frames)
                req = replace(req, body=encode_frames(again), frames=tuple(again),
                              rank_steps=per * len(again))  # fmt: skip
                await asyncio.sleep(retry if retry is not None else 1.0)
                continue
            if 200 <= status < 300:  # Prometheus answers 204
                now = time.monotonic() - t0
                out.latencies.append(now - req.due)
                out.acked_rank_steps += req.rank_steps
                out.acked_at.append((now, req.rank_steps))
                break
            if status in _RETRY:
                out.refused[status] = out.refused.get(status, 0) + 1
                out.retries += 1
                await asyncio.sleep(retry if retry is not None else 1.0)
                continue
            out.errors += 1
            break
    conn.close()


async def _drive(url_host: str, port: int, plan: Plan, out: Outcome) -> None:
    t0 = time.monotonic() + 0.2
    queues: list[asyncio.Queue[Request | None]] = [asyncio.Queue() for _ in range(plan.connections)]
    tasks = [asyncio.create_task(_sender(_Conn(url_host, port), q, out, t0)) for q in queues]
    for k in range(plan.seconds):
        batch = sorted(plan.second(k), key=lambda r: r.due)
        for req in batch:
            delay = t0 + req.due - time.monotonic()
            out.lag_s.append(max(0.0, -delay))
            if delay > 0:
                await asyncio.sleep(delay)
            out.requests += 1
            queues[req.sender % plan.connections].put_nowait(req)
    for q in queues:
        q.put_nowait(None)
    await asyncio.gather(*tasks)


def drive(host: str, port: int, plan: Plan) -> Outcome:
    """Send ``plan`` to ``host:port`` and wait for every answer."""
    out = Outcome()
    try:
        import uvloop

        runner: Callable[..., object] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency of the server
        runner = asyncio.run
    runner(_drive(host, port, plan, out))
    return out


def spread(n: int, second: int) -> Iterator[float]:
    """``n`` due times spread evenly over ``second`` (the senders' flush timers are not in
    step)."""
    return (second + i / n for i in range(n))
