"""The codes' plain names (:mod:`fleetlens.names`) that every portal page embeds for
``static/app.js``'s labels, keyed as the JavaScript reads them (camelCase, as the JSON API)."""

from __future__ import annotations

from pydantic import Field

from ..names import DIAGNOSES, XID_ACTIONS
from .models import ApiModel

__all__ = ["CodeNamesOut"]


class CodeNamesOut(ApiModel):
    """Plain names of diagnosis codes and of the actions an Xid error asks for."""

    diagnoses: dict[str, str] = Field(description="diagnosis code -> its plain name")
    xid_actions: dict[str, str] = Field(description="Xid action code -> what it asks for")

    @classmethod
    def all(cls) -> CodeNamesOut:
        return cls(diagnoses=dict(DIAGNOSES), xid_actions=dict(XID_ACTIONS))
