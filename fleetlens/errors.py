"""The one exception hierarchy of fleetlens.

    FleetlensError
    ├── ConfigError            a setting is missing or has a bad value
    ├── WireError              a batch cannot be decoded or fails validation
    │   ├── UnsupportedVersion the batch's wire version is not one we read
    │   └── BatchTooLarge      the batch is over the size or row limit
    ├── StoreError             a store refused or failed an operation
    │   └── NotFound           the object asked for does not exist (or is not visible)
    └── TransportError         the SDK could not hand a batch to the collector

Third-party errors are translated at the boundary with ``raise ... from exc``.
Nothing in here is ever raised into a training loop: the SDK counts its failures.
"""

from __future__ import annotations

__all__ = [
    "BatchTooLarge",
    "ConfigError",
    "FleetlensError",
    "NotFound",
    "StoreError",
    "TransportError",
    "UnsupportedVersion",
    "WireError",
]


class FleetlensError(Exception):
    """Root of every error fleetlens raises on purpose."""


class ConfigError(FleetlensError):
    """A setting is missing or has a value we refuse to guess about."""


class WireError(FleetlensError):
    """A batch is malformed; the message names the field and what was expected."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnsupportedVersion(WireError):
    """The batch declares a wire version this server does not read."""


class BatchTooLarge(WireError):
    """The batch is over the byte or row limit."""


class StoreError(FleetlensError):
    """A telemetry or metadata store operation failed."""


class NotFound(StoreError):
    """The object does not exist, or the caller may not know that it does."""


class TransportError(FleetlensError):
    """A batch could not be delivered; ``retry_after`` is the server's hint in seconds."""

    def __init__(self, message: str, retry_after: float | None = None, permanent: bool = False):
        super().__init__(message)
        self.retry_after = retry_after
        self.permanent = permanent
