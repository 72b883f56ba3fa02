"""A rank's answer to an instruction as the remediation machine keeps it: the control channel's
document (``POST /v1/runs/{run_id}/control``, camelCase keys, extra keys kept), stored as is in
an action's ``acks``. The machine reads the few keys it needs by name through :class:`AckKeys`
and writes its own entries (:class:`StoppedAck`) with the same rule, so stored actions read the
same before and after."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

__all__ = ["AckKeys", "StoppedAck", "Verification", "ack_keys"]


class AckKeys(msgspec.Struct, frozen=True, rename="camel"):
    """What the machine reads of an answer by name; absent keys are ``UNSET``."""

    job_id: Any = msgspec.UNSET
    """The job attempt that answered (as sent)."""
    loaded_at: Any = msgspec.UNSET
    """``resumed``: when the restarted attempt had loaded its checkpoint (as sent)."""
    load_s: Any = msgspec.UNSET
    """``resumed``: the seconds the checkpoint took to load (as sent)."""

    def job(self, absent: object = None) -> object:
        """The answering job, or ``absent`` when the answer names none."""
        return absent if self.job_id is msgspec.UNSET else self.job_id

    def loaded(self, absent: float) -> float:
        """When the checkpoint was loaded, or ``absent`` when the answer does not say."""
        return absent if self.loaded_at is msgspec.UNSET else float(self.loaded_at)

    def load_seconds(self) -> float:
        """How long the checkpoint took to load (0 when the answer does not say)."""
        return 0.0 if self.load_s is msgspec.UNSET else float(self.load_s)


def ack_keys(doc: Mapping[str, Any]) -> AckKeys:
    return msgspec.convert(doc, AckKeys)


class StoppedAck(msgspec.Struct, frozen=True, rename="camel"):
    """The entry the machine adds once every rank of the job stopped."""

    event: str
    ranks: int
    time: float | None
    job_id: str
    received: float


class Verification(msgspec.Struct, frozen=True, rename="camel"):
    """Who read the drain checkpoint back before the node was removed (added to its manifest)."""

    verified_by: str
