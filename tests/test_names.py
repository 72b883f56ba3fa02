"""Every code a person sees has a plain name (fleetlens/names.py): each diagnosis the analyses
make and each action of the Xid catalog."""

from __future__ import annotations

import csv
from importlib import resources

import pytest

from fleetlens.analysis.rootcause import OWNERS, xid_diagnosis
from fleetlens.names import DIAGNOSES, XID_ACTIONS, action_name, diagnosis_name

pytestmark = pytest.mark.unit


def test_every_diagnosis_has_a_name() -> None:
    assert set(DIAGNOSES) == set(OWNERS)
    assert diagnosis_name("straggler.persistent") == "Slow rank (every step)"
    assert diagnosis_name("new_kind.sub") == "New kind: sub"  # an unknown code, in words


def test_every_catalog_action_has_words_and_keeps_its_code() -> None:
    text = resources.files("fleetlens.analysis").joinpath("data/xid_catalog.csv").read_text()
    rows = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    actions = {(r["immediate_action"] or r["nvsentinel_action"]).strip() for r in rows} - {""}
    assert actions and actions <= set(XID_ACTIONS), actions - set(XID_ACTIONS)
    assert action_name("RESTART_BM") == "reboot the node (RESTART_BM)"
    assert action_name("") == "none listed"


def test_a_fatal_xid_finding_says_its_action_in_words() -> None:
    d = xid_diagnosis(79, "node-a", 3, rank=5, step=10, time=1.0)
    assert d.diagnosis == "fatal_xid"
    assert "catalog action: " in d.summary and "(" in d.summary.split("catalog action: ")[1]
