"""The control channel: the server's instructions to a running job (a drain), and its answers.

Opt-in and off the hot path: nothing starts it until a job asks for it (``fleetlens.torch``'s
``TorchRun.stop_requested`` does). A daemon thread then polls ``GET /v1/runs/{run}/control``
every ``interval`` seconds with where this rank is (job attempt, step, collective sequence, and
since when that has not changed), so the server can tell a hung rank from the ranks waiting for
it, and keeps the newest instruction in :attr:`ControlChannel.action`. Answers (``ack``) are
queued and sent by the same thread. Nothing here raises: failures are counted.

Two instructions are carried out by this thread itself, because the training thread may be
stuck in a collective when they arrive: ``remove`` for this rank's node stops the node's
launcher agent (the worker's parent: torchrun's agent, which then leaves the rendezvous), and
``restart`` with ``force`` exits the worker with :data:`DRAIN_EXIT_CODE` when the training
thread has not done so itself within ``force_grace_s``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from .config import SDKConfig

__all__ = ["DRAIN_EXIT_CODE", "CaptureAsk", "ControlChannel"]

DRAIN_EXIT_CODE = 75
"""A drained worker's exit status (EX_TEMPFAIL): non-zero, so torchrun restarts the workers."""


class CaptureAsk(msgspec.Struct, frozen=True, rename="camel"):
    """A trace capture the server asks of the job (a poll's ``capture``): profile ``steps``
    steps after ``warmup`` from step ``from_step`` on, on the ranks named."""

    id: int = 0
    steps: int = 3
    warmup: int = 1
    ranks: tuple[int, ...] = ()
    from_step: int | None = None


class _Addressed(msgspec.Struct, rename="camel"):
    """Whom an instruction (a poll's ``action``) is for: a job attempt (empty: any)."""

    job_id: str | None = None


class _Poll(msgspec.Struct, rename="camel", omit_defaults=True):
    """A poll's query: where the rank is, and what it offers (``capture`` 1: trace captures;
    ``acts`` 0: it carries out no instruction)."""

    job_id: str
    rank: int
    world: int
    node: str
    step: int
    seq: int
    progress_at: str
    pid: int
    agent_pid: int
    capture: int = 0
    acts: int = 1


class _PollAnswer(msgspec.Struct, rename="camel"):
    """A poll's answer, unchecked: an instruction for the job (``action``), a trace capture asked
    of it, and the least seconds between polls the server wants (``min_interval_s``)."""

    action: Any = None
    capture: Any = None
    min_interval_s: Any = None


class _AckHead(msgspec.Struct, rename="camel"):
    """Who answers an instruction, and when; the answer's own fields follow."""

    id: int
    event: str
    rank: int
    node: str
    job_id: str
    time: float


def _job_of(action: dict[str, Any]) -> str:
    """The job attempt an instruction is for ("" when any)."""
    return msgspec.convert(action, _Addressed, strict=False).job_id or ""


class ControlChannel:
    def __init__(
        self,
        cfg: SDKConfig,
        position: Callable[[], tuple[int, int]],
        *,
        interval: float = 2.0,
        flush: Callable[[float], Any] | None = None,
        force_grace_s: float = 2.0,
        acts: bool = True,
    ) -> None:
        self.config = cfg
        base = cfg.server.rstrip("/")
        self._url = f"{base}/v1/runs/{urllib.parse.quote(cfg.run_id, safe='')}/control"
        self._headers = {"Authorization": f"Bearer {cfg.token}"} if cfg.token else {}
        self._position = position
        self.interval = interval
        self.min_interval = 0.0  # the server's floor for this job's size (it spreads the load)
        self._flush = flush
        self.force_grace_s = force_grace_s
        self.action: dict[str, Any] | None = None
        # A triggered trace capture (fleetlens.torch.capture): offered on each poll when set,
        # and the newest capture this rank is asked for.
        self.capture_offer = False
        # False: the channel only offers captures; the server leaves the job out of remediation
        # (no position reported) and this thread carries out no instruction
        self.acts = acts
        self.capture: CaptureAsk | None = None
        self.errors = 0
        self.rejected = 0
        self.polls = 0
        self._acks: deque[dict[str, Any]] = deque(maxlen=64)
        self._wake = threading.Event()
        self._polled = threading.Condition()
        self._stop = threading.Event()
        self._handled: set[tuple[int, str]] = set()
        self._last_pos: tuple[int, int] | None = None
        self._progress_at = time.time()
        self.exiting = threading.Event()  # set when the training thread is exiting on its own
        self._thread = threading.Thread(target=self._loop, name="fleetlens-control", daemon=True)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- what the training thread uses -----------------------------------------------------------

    def pending(self, phase: str) -> dict[str, Any] | None:
        """The current instruction if it is ``phase`` and meant for this job attempt."""
        a = self.action
        if a is None or a.get("phase") != phase:
            return None
        job = _job_of(a)
        return a if not job or job == self.config.job_id else None

    def ack(self, action_id: int, event: str, **fields: Any) -> None:
        """Queue an answer for the server; sent at once by the channel's thread."""
        cfg = self.config
        head = _AckHead(action_id, event, cfg.rank, cfg.node_id, cfg.job_id, time.time())
        self._acks.append({**msgspec.to_builtins(head), **fields})
        self._wake.set()

    def poll_now(self) -> None:
        self._wake.set()

    @property
    def cadence(self) -> float:
        return max(self.interval, self.min_interval)

    def next_poll(self, timeout: float, *, now: bool = False) -> None:
        """Wait until the channel's next poll has answered (or ``timeout``); ``now`` asks for
        that poll at once instead of at the channel's cadence."""
        with self._polled:
            seen = self.polls
            if now:
                self._wake.set()
            self._polled.wait_for(lambda: self.polls > seen, timeout)

    # -- the thread -----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._send_acks()
                self._poll()
                self._act()
            except Exception:
                self.errors += 1
            self._wake.wait(self.cadence)
            self._wake.clear()
        try:
            self._send_acks()
        except Exception:
            self.errors += 1

    def _request(self, method: str, url: str, body: bytes | None = None) -> Any:
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=body, headers=headers, method=method)
        with urllib.request.urlopen(req, timeout=self.config.send_timeout) as r:
            return json.loads(r.read() or b"null")

    def _poll(self) -> None:
        pos = self._position()
        now = time.time()
        if pos != self._last_pos:
            self._last_pos, self._progress_at = pos, now
        cfg = self.config
        poll = _Poll(
            job_id=cfg.job_id,
            rank=cfg.rank,
            world=cfg.world_size,
            node=cfg.node_id,
            step=pos[0],
            seq=pos[1],
            progress_at=f"{self._progress_at:.3f}",
            pid=os.getpid(),
            agent_pid=os.getppid(),
            capture=1 if self.capture_offer else 0,
            acts=1 if self.acts else 0,
        )
        query = urllib.parse.urlencode(msgspec.to_builtins(poll))
        try:
            out = self._request("GET", f"{self._url}?{query}")
        except Exception:
            self.errors += 1
            return
        if isinstance(out, dict):
            got = msgspec.convert(out, _PollAnswer)
            self.action = got.action
            self.capture = _capture_ask(got.capture)
            floor = got.min_interval_s
            if isinstance(floor, (int, float)) and 0 <= floor <= 60:
                self.min_interval = float(floor)
        with self._polled:
            self.polls += 1
            self._polled.notify_all()

    def _send_acks(self) -> None:
        while self._acks:
            body = json.dumps(self._acks[0]).encode()
            try:
                self._request("POST", self._url, body)
            except urllib.error.HTTPError as exc:
                self.errors += 1
                if exc.code == 429 or exc.code >= 500:
                    return  # kept; the next round retries
                self.rejected += 1  # the server refused it: retrying cannot help
            except Exception:
                self.errors += 1
                return  # kept; the next round retries
            self._acks.popleft()

    def _act(self) -> None:
        a = self.action
        if a is None or not self.acts:
            return
        aid, phase = int(a.get("id", 0)), str(a.get("phase", ""))
        if (aid, phase) in self._handled or _job_of(a) not in ("", self.config.job_id):
            return  # done already, or meant for an earlier attempt of the job
        mine = a.get("node") == self.config.node_id
        if phase == "remove" and mine:
            self._handled.add((aid, phase))
            agent = os.getppid()
            self.ack(aid, "agent_stopping", agentPid=agent)
            self._send_acks()
            if self._flush is not None:
                self._flush(2.0)
            if agent > 1:
                os.kill(agent, signal.SIGTERM)
        elif phase == "restart" and a.get("force"):
            self._handled.add((aid, phase))
            if self.exiting.wait(self.force_grace_s):
                return
            if self._flush is not None:
                self._flush(2.0)
            os._exit(DRAIN_EXIT_CODE)  # the training thread is stuck in a collective


def _capture_ask(asked: object) -> CaptureAsk | None:
    """A poll's ``capture``: None when there is none, or none this SDK can read."""
    if not isinstance(asked, dict):
        return None
    try:
        return msgspec.convert(asked, CaptureAsk, strict=False)
    except msgspec.ValidationError:
        return None
