"""Parse dcgm-exporter's Prometheus exposition into GPU samples under our DCGM-named columns.

dcgm-exporter (NVIDIA/dcgm-exporter) serves one line per field and GPU, labelled ``gpu``,
``UUID`` and ``Hostname``; the field names are DCGM's (``DCGM_FI_DEV_GPU_TEMP``, ...), which
:data:`fleetlens.dcgm_fields.DCGM_FIELDS` maps to our columns. Fields we do not store are ignored;
Kubernetes attribution labels (``pod``, ``namespace``, ``container``) are kept per GPU.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..dcgm_fields import DCGM_FIELDS

__all__ = ["DcgmGpu", "parse_exposition"]

# Newer exporters renamed the throttle field; both land in the same column.
_COLUMN_BY_FIELD = {v: k for k, v in DCGM_FIELDS.items()} | {
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "throttle_reasons",
}
_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?\s*$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class DcgmGpu:
    """One GPU's fields from one scrape."""

    node_id: str
    gpu: int
    gpu_uuid: str
    model: str = ""
    values: dict[str, float] = field(default_factory=dict)
    attribution: dict[str, str] = field(default_factory=dict)

    def sample(self, time: float) -> dict[str, Any]:
        """The record for a ``gpu`` sample (schema.GPU columns)."""
        return {
            "time": time,
            "node_id": self.node_id,
            "gpu": self.gpu,
            "gpu_uuid": self.gpu_uuid,
            **self.values,
        }


def _float(raw: str) -> float:
    v = float(raw)  # Prometheus spells +Inf, -Inf and NaN the way float() reads them
    return v if math.isfinite(v) else math.nan


def parse_exposition(text: str, node: str = "") -> list[DcgmGpu]:
    """GPUs found in one scrape, in order of first appearance; malformed lines are skipped.
    ``node``: the agent's node id, which names every GPU (without one, the Hostname label)."""
    gpus: dict[tuple[str, int], DcgmGpu] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, _, labels_raw, value = m.group(1), m.group(2), m.group(3) or "", m.group(4)
        column = _COLUMN_BY_FIELD.get(name)
        if column is None:
            continue
        labels = dict(_LABEL.findall(labels_raw))
        try:
            index = int(labels.get("gpu", ""))
            number = _float(value)
        except ValueError:
            continue
        # The agent's node id wins: its host samples and the ranks' placement use it, and
        # the exporter's Hostname is often not the node's (on Kubernetes, the exporter pod's).
        where = node or labels.get("Hostname", "")
        key = (where, index)
        g = gpus.get(key)
        if g is None:
            g = gpus[key] = DcgmGpu(
                where, index, labels.get("UUID", ""), labels.get("modelName", "")
            )
        g.values[column] = number
        for k in ("pod", "namespace", "container"):
            if labels.get(k):
                g.attribution[k] = labels[k]
    return list(gpus.values())
