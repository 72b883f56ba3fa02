"""Notifiers: Alertmanager (API v2), a generic JSON webhook, a Slack-compatible webhook.

All sit behind one narrow protocol, ``send(alerts)``. Delivery runs on its own thread from a
bounded queue, retried with exponential backoff: a dead receiver delays its own notifications
and nothing else (ingestion and analysis never wait for it). What could not be delivered after
the retries is counted, not raised.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec

from ..client import Client
from ..errors import FleetlensError

__all__ = [
    "AlertPayload",
    "AlertmanagerNotifier",
    "Delivery",
    "Notifier",
    "PostableAlert",
    "SlackNotifier",
    "WebhookAlert",
    "WebhookMessage",
    "WebhookNotifier",
]


@dataclass(frozen=True)
class AlertPayload:
    """One alert as notifiers see it: Alertmanager's model (labels, annotations, times)."""

    fingerprint: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    ends_at: float | None  # set when resolved
    generator_url: str = ""

    @property
    def status(self) -> str:
        return "resolved" if self.ends_at is not None else "firing"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


class PostableAlert(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """An alert as Alertmanager's API v2 takes it (``POST /api/v2/alerts``): times in RFC 3339;
    no ``endsAt`` while it fires."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str
    ends_at: str | None = None
    generator_url: str = msgspec.field(default="", name="generatorURL")


class WebhookAlert(msgspec.Struct, frozen=True, rename="camel"):
    """An alert in Alertmanager's webhook message (version 4); a firing one ends at year 1."""

    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str
    ends_at: str
    fingerprint: str
    generator_url: str = msgspec.field(name="generatorURL")


class WebhookMessage(msgspec.Struct, frozen=True, kw_only=True):
    """Alertmanager's webhook message (version 4), as its receivers expect it."""

    version: str = "4"
    status: str
    receiver: str = "fleetlens"
    alerts: list[WebhookAlert]


class _Receiver:
    """The HTTP side of a notifier: one keep-alive client to its receiver, made on first use.

    Never a fleetlens token: the receiver is someone else's service.
    """

    def __init__(self, name: str, url: str, timeout: float) -> None:
        self.name, self.url, self.timeout = name, url, timeout
        self._client: Client | None = None

    def post(self, url: str, body: Any) -> None:
        """POST ``body`` as JSON to the absolute ``url``; raise FleetlensError unless 2xx."""
        if self._client is None:
            self._client = Client(self.url, token="", timeout=self.timeout, service=self.name)
        self._client.request("POST", url, json=body)


class Notifier(Protocol):
    name: str

    def send(self, alerts: list[AlertPayload]) -> None:
        """Deliver or raise; the delivery thread retries."""


@dataclass
class AlertmanagerNotifier:
    """``POST {url}/api/v2/alerts``; a resolved alert is re-sent with ``endsAt`` in the past."""

    url: str
    timeout: float = 5.0
    name: str = "alertmanager"
    _receiver: _Receiver = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._receiver = _Receiver(self.name, self.url, self.timeout)

    def send(self, alerts: list[AlertPayload]) -> None:
        body = [
            PostableAlert(
                labels=a.labels,
                annotations=a.annotations,
                starts_at=_iso(a.starts_at),
                ends_at=None if a.ends_at is None else _iso(a.ends_at),
                generator_url=a.generator_url,
            )
            for a in alerts
        ]
        self._receiver.post(self.url.rstrip("/") + "/api/v2/alerts", msgspec.to_builtins(body))


@dataclass
class WebhookNotifier:
    """A JSON webhook in Alertmanager's webhook shape (version 4), so existing receivers work."""

    url: str
    timeout: float = 5.0
    name: str = "webhook"
    _receiver: _Receiver = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._receiver = _Receiver(self.name, self.url, self.timeout)

    def send(self, alerts: list[AlertPayload]) -> None:
        status = "firing" if any(a.ends_at is None for a in alerts) else "resolved"
        message = WebhookMessage(
            status=status,
            alerts=[
                WebhookAlert(
                    status=a.status,
                    labels=a.labels,
                    annotations=a.annotations,
                    starts_at=_iso(a.starts_at),
                    ends_at=_iso(a.ends_at) if a.ends_at else "0001-01-01T00:00:00Z",
                    fingerprint=a.fingerprint,
                    generator_url=a.generator_url,
                )
                for a in alerts
            ],
        )
        self._receiver.post(self.url, msgspec.to_builtins(message))


@dataclass
class SlackNotifier:
    """A Slack-compatible incoming webhook: one message per batch of alerts."""

    url: str
    timeout: float = 5.0
    name: str = "slack"
    _receiver: _Receiver = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._receiver = _Receiver(self.name, self.url, self.timeout)

    def send(self, alerts: list[AlertPayload]) -> None:
        lines = []
        for a in alerts:
            icon = (
                ":white_check_mark:"
                if a.ends_at
                else (":rotating_light:" if a.labels.get("severity") == "page" else ":warning:")
            )
            where = " ".join(
                f"{k}={a.labels[k]}" for k in ("run_id", "node", "gpu", "rank") if a.labels.get(k)
            )
            lines.append(
                f"{icon} *{a.labels.get('alertname', 'alert')}* [{a.status}] {where}\n"
                f"{a.annotations.get('summary', '')}"
            )
        self._receiver.post(self.url, {"text": "\n".join(lines)})


@dataclass
class Delivery:
    """A bounded queue per notifier, drained by one thread with retries and backoff."""

    notifiers: list[Notifier]
    max_queue: int = 10_000
    retries: int = 5
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._queue: queue.Queue[tuple[Notifier, list[AlertPayload]] | None] = queue.Queue(
            self.max_queue
        )
        self._thread = threading.Thread(target=self._loop, name="fleetlens-notify", daemon=True)
        self._thread.start()
        self.delivered_at: dict[str, float] = {}

    def _count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def submit(self, alerts: list[AlertPayload]) -> None:
        """Queue alerts for every notifier; never blocks (a full queue drops and counts)."""
        if not alerts:
            return
        for n in self.notifiers:
            try:
                self._queue.put_nowait((n, alerts))
            except queue.Full:
                self._count(f"{n.name}_dropped", len(alerts))

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until everything queued so far was delivered or given up (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._deliver(*item)
            finally:
                self._queue.task_done()

    def _deliver(self, notifier: Notifier, alerts: list[AlertPayload]) -> None:
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                notifier.send(alerts)
            except (FleetlensError, OSError, ValueError):
                self._count(f"{notifier.name}_errors")
                if attempt == self.retries:
                    self._count(f"{notifier.name}_failed", len(alerts))
                    return
                time.sleep(delay * (0.5 + random.random() / 2))
                delay = min(self.backoff_max_s, delay * 2)
            else:
                self._count(f"{notifier.name}_sent", len(alerts))
                now = time.time()
                for a in alerts:
                    self.delivered_at[a.fingerprint] = now
                return

    def close(self, timeout: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)
