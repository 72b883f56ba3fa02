"""XID codes classified by NVIDIA's Xid catalog: fatal, recoverable or application.

The table is ``data/xid_catalog.csv``, shipped with the package and read once on first use. It
is NVIDIA's published Xid catalog (https://docs.nvidia.com/deploy/xid-errors/ ->
"analyzing-xid-catalog", sheet ``Xids`` of ``Xid-Catalog.xlsx``) joined with NVSentinel's
``xiderrorsmapping.csv`` (NVIDIA/NVSentinel, Apache-2.0); the file's header names the commits.

Classes, in this order:

- ``fatal``: NVSentinel marks it FATAL (the GPU needs a reset, a reboot or support; the job on
  it is lost). This is how Xid 48 (double-bit ECC), 74 (NVLink), 79 (fell off the bus) and 95
  (uncontained memory error) come out.
- ``application``: non-fatal and the catalog's trigger text blames the user application (Xid
  13, 31, 43, 45): restart the job, the GPU is healthy; owner training code.
- ``recoverable``: every other non-fatal code (Xid 63 row remapping, 92 excessive SBE, 94
  contained error): the GPU keeps working, a ticket rather than a page.
- ``unknown``: not in the catalog.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

__all__ = ["XidInfo", "classify_xid", "xid_catalog"]


@dataclass(frozen=True)
class XidInfo:
    xid: int
    mnemonic: str
    description: str
    severity: str  # fatal | application | recoverable | unknown
    action: str  # the catalog's immediate action (RESET_GPU, RESTART_APP, ...)
    ecc: bool  # a memory (ECC) error: the diagnosis is ecc_xid rather than fatal_xid

    @property
    def fatal(self) -> bool:
        return self.severity == "fatal"


_APP_WORDS = ("user application", "application-level", "application error", "application abort")


def _classify(row: dict[str, str]) -> XidInfo:
    xid = int(row["xid"])
    sev = row["nvsentinel_severity"].strip().upper()
    action = row["immediate_action"].strip() or row["nvsentinel_action"].strip()
    trigger = (row["trigger_conditions"] + " " + row["description"]).lower()
    if sev == "FATAL" or (not sev and action in ("RESET_GPU", "RESTART_BM", "CONTACT_SUPPORT")):
        severity = "fatal"
    elif any(w in trigger for w in _APP_WORDS) or "aborts" in trigger:
        severity = "application"
    else:
        severity = "recoverable"
    mnemonic = row["mnemonic"].strip()
    ecc = "ECC" in mnemonic or "ecc" in row["description"].lower()
    return XidInfo(xid, mnemonic, row["description"].strip(), severity, action, ecc)


@lru_cache(maxsize=1)
def xid_catalog() -> dict[int, XidInfo]:
    """Every Xid of the shipped catalog, classified (read once; the file is package data)."""
    text = resources.files("fleetlens.analysis").joinpath("data/xid_catalog.csv").read_text()
    body = io.StringIO("".join(line for line in io.StringIO(text) if not line.startswith("#")))
    return {int(r["xid"]): _classify(r) for r in csv.DictReader(body) if r["xid"].isdigit()}


def classify_xid(xid: int) -> XidInfo:
    """The catalog's entry for ``xid``; an unknown code is ``unknown`` (never guessed fatal)."""
    info = xid_catalog().get(int(xid))
    if info is None:
        return XidInfo(int(xid), "", "not in NVIDIA's Xid catalog", "unknown", "", False)
    return info
