"""The one exception hierarchy of fleetlens.

    FleetlensError
    ├── ConfigError            a setting or an argument has a bad value (also a ValueError)   400
    │   └── UnknownName        a name outside a fixed table (an accelerator, a dtype)         422
    ├── WireError              a batch cannot be decoded or fails validation                  400
    │   ├── UnsupportedVersion the batch's wire version is not one we read                    400
    │   └── BatchTooLarge      the batch is over the size or row limit                        413
    ├── TraceFormatError       a file is not a profiler trace the reader can use              400
    ├── Conflict               the object's state does not allow the request                  409
    │   ├── Refused            an answer a remediation action's state does not allow
    │   ├── LeaseLost          an evaluation shard's lease is held by another worker now
    │   └── PromotionRefused   an alias move without a passing gate
    ├── StoreError             a store refused or failed an operation                         503
    │   └── NotFound           the object asked for does not exist (or is not visible)        404
    ├── TransportError         the SDK or the client could not reach the server
    ├── APIError               the server answered 4xx/5xx (``fleetlens.Client``)
    │   └── APINotFound        ... 404 (also a NotFound)
    ├── AdapterError           an evaluated model's endpoint did not answer (the shard is retried)
    ├── SandboxUnavailable     the jail for generated code is missing or failed to start
    └── SimError               the simulator's output was refused or could not be delivered

The right-hand column is the HTTP status the API answers with (``STATUS``, applied by one
exception handler in :mod:`fleetlens.api.app`); an error not in it is a 500. Third-party errors
are translated at the boundary with ``raise ... from exc``. Nothing in here is ever raised into a
training loop: the SDK counts its failures.
"""

from __future__ import annotations

__all__ = [
    "STATUS",
    "APIError",
    "APINotFound",
    "AdapterError",
    "BatchTooLarge",
    "ConfigError",
    "Conflict",
    "FleetlensError",
    "LeaseLost",
    "NotFound",
    "PromotionRefused",
    "Refused",
    "SandboxUnavailable",
    "SimError",
    "StoreError",
    "TraceFormatError",
    "TraceTooLarge",
    "TransportError",
    "UnknownName",
    "UnsupportedVersion",
    "WireError",
    "http_status",
]


class FleetlensError(Exception):
    """Root of every error fleetlens raises on purpose."""


class ConfigError(FleetlensError, ValueError):
    """A setting or an argument has a value we refuse to guess about. It is a ``ValueError``
    too, as a bad argument is in Python."""


class UnknownName(ConfigError):
    """A name that must be one of a fixed table's (an accelerator, a dtype) is not; the message
    lists the known ones."""


class WireError(FleetlensError):
    """A batch is malformed; the message names the field and what was expected."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnsupportedVersion(WireError):
    """The batch declares a wire version this server does not read."""


class BatchTooLarge(WireError):
    """The batch is over the byte or row limit."""


class TraceFormatError(FleetlensError):
    """A file is not a Kineto trace, or a field in it has a type the reader cannot use."""


class TraceTooLarge(TraceFormatError):
    """A trace that decompresses past the reader's limit; nothing is kept of it."""


class Conflict(FleetlensError):
    """The request is well formed, but the object's current state does not allow it."""


class Refused(Conflict):
    """A person's answer the remediation action's state does not allow."""


class LeaseLost(Conflict):
    """The report's lease token is not the shard's any more (expired and leased again)."""


class PromotionRefused(Conflict):
    """A guarded alias move without a passing gate (or an admin's override)."""


class StoreError(FleetlensError):
    """A telemetry or metadata store operation failed."""


class NotFound(StoreError):
    """The object does not exist, or the caller may not know that it does."""


class TransportError(FleetlensError):
    """A batch or a request could not be handed to the server (connection, timeout);
    ``retry_after`` is the server's hint in seconds, ``permanent`` that a retry cannot help,
    ``status`` the server's answer when there was one."""

    def __init__(
        self,
        message: str,
        retry_after: float | None = None,
        permanent: bool = False,
        status: int | None = None,
    ):
        super().__init__(message)
        self.retry_after = retry_after
        self.permanent = permanent
        self.status = status


class APIError(FleetlensError):
    """The server answered 4xx/5xx; ``status`` and ``message`` are its code and its words."""

    def __init__(
        self,
        method: str,
        url: str,
        status: int,
        message: str,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{method} {url}: HTTP {status}: {message}")
        self.method = method
        self.url = url
        self.status = status
        self.message = message
        self.retry_after = retry_after


class APINotFound(APIError, NotFound):
    """HTTP 404: the object does not exist, or the token may not see it."""


class AdapterError(FleetlensError):
    """The model did not answer (endpoint down, bad response): the shard is retried."""


class SandboxUnavailable(FleetlensError):
    """Generated code would run without its jail (bubblewrap missing or unable to start); the
    message names what is missing and how to install it."""


class SimError(FleetlensError):
    """The simulator produced something the collector refused, or could not deliver it."""


# The API's answer to each error, most specific first (the first class the error is an
# instance of wins).
STATUS: tuple[tuple[type[FleetlensError], int], ...] = (
    (NotFound, 404),
    (BatchTooLarge, 413),
    (TraceTooLarge, 413),
    (WireError, 400),
    (TraceFormatError, 400),
    (UnknownName, 422),
    (ConfigError, 400),
    (Conflict, 409),
    (StoreError, 503),
)


def http_status(exc: BaseException) -> int:
    """The HTTP status the API answers ``exc`` with: :data:`STATUS`, else 500."""
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    return 500
