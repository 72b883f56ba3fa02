"""What a disabled ``init`` returns: a :class:`Run` that is free (no thread, no I/O)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .config import SDKConfig
from .run import Run
from .spans import Checkpoint, Phase, Step

__all__ = ["NullRun"]

F = TypeVar("F", bound=Callable[..., Any])


class NullRun(Run):
    """What a disabled ``init`` returns: every method returns at once, no thread, no I/O."""

    def __init__(self, cfg: SDKConfig | None = None) -> None:  # no super(): nothing to start
        self.config = cfg or SDKConfig(enabled=False)

    def step(self, n: int | None = None, *, tokens: int = 0) -> Step:
        return _NULL  # type: ignore[return-value]

    def phase(self, name: str) -> Phase:
        return _NULL  # type: ignore[return-value]

    def add_phase(self, name: str, seconds: float) -> None:
        return None

    def record_step(self, step: int, **kwargs: Any) -> None:
        return None

    def log(self, step: int, /, **scalars: float) -> None:
        return None

    def data(self, step: int, /, **kwargs: Any) -> None:
        return None

    def event(self, kind: str, step: int | None = None, message: str = "", **attrs: Any) -> None:
        return None

    def collective(self, **kwargs: Any) -> None:
        return None

    def checkpoint(self, step: int | None = None, **kwargs: Any) -> Checkpoint:
        return _NULL  # type: ignore[return-value]

    def flush(self, timeout: float = 5.0) -> bool:
        return True

    def finish(self, status: str = "ok", message: str = "") -> None:
        return None

    def stats(self) -> dict[str, Any]:
        return {"enabled": False}


class _NullSpan:
    """A context manager and decorator that does nothing, shared by every disabled call."""

    __slots__ = ()

    def __enter__(self) -> _NullSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn: F) -> F:
        return fn


_NULL = _NullSpan()
