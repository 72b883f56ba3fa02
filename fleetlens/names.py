"""Plain-language names for the codes the analyses and the Xid catalog use.

A finding's ``diagnosis`` (``straggler.persistent``, ``fatal_xid``) and a catalog action
(``RESTART_BM``) are identifiers: the API, alerting and the CLI key on them. A person reads the
name; the portal shows it with the code in a tooltip, and the finding's summary names the
action in words with the code after it.
"""

from __future__ import annotations

__all__ = ["DIAGNOSES", "XID_ACTIONS", "action_name", "diagnosis_name"]

DIAGNOSES: dict[str, str] = {
    "straggler.persistent": "Slow rank (every step)",
    "straggler.intermittent": "Slow rank (now and then)",
    "straggler.moving": "Slowness that moves between ranks",
    "thermal": "GPU slowed by heat",
    "rack_cooling": "Rack cooling",
    "nvlink": "NVLink errors",
    "ecc_xid": "GPU memory (ECC) error",
    "fatal_xid": "GPU failure (fatal Xid)",
    "xid_recoverable": "GPU error, recoverable (Xid)",
    "network": "Slow network",
    "data_stall": "Waiting on input data",
    "host": "Host problem (CPU, memory, disk)",
    "inefficient_compute": "Compute below its expected speed",
    "instability": "Training instability (loss or gradients)",
    "oom": "Out of memory",
    "software_crash": "Training code crashed",
    "rank_lost": "Rank lost (process gone)",
    "hang": "Job hung",
    "preemption": "Preempted by the scheduler",
    "maintenance": "Planned maintenance",
    "slow_checkpoint": "Slow checkpoint",
    "topology": "Poor placement (topology)",
    "stage_imbalance": "Uneven pipeline stages",
    "memory_climb": "Memory climbing to its limit",
    "batch_imbalance": "Uneven batches across replicas",
    "program_regression": "Slower than its workload's baseline",
    "startup_regression": "Slower start than its workload's baseline",
    "mfu_regression": "Lower MFU than its architecture's baseline",
    "token_regression": "More GPU time a token than its architecture's baseline",
    "scaling_regression": "Scales worse than on the software it replaced",
    "recovery_regression": "Slower recovery than its workload's baseline",
    "checkpoint_regression": "Longer checkpoint pauses than its workload's baseline",
    "allocation_regression": "Longer wait for a complete allocation than its pool's baseline",
}
"""Every diagnosis the analyses make (``fleetlens.analysis.rootcause.OWNERS`` lists the same)."""

XID_ACTIONS: dict[str, str] = {
    "CONTACT_SUPPORT": "contact the vendor's support",
    "RESTART_APP": "restart the application",
    "IGNORE": "no action needed",
    "RESET_GPU": "reset the GPU",
    "RESTART_BM": "reboot the node",
    "RESTART_VM": "restart the virtual machine",
    "CHECK_MECHANICALS": "check the GPU's mechanical fit and cooling",
    "CHECK_UVM": "check the unified-memory driver",
    "UPDATE_SWFW": "update the driver or firmware",
    "WORKFLOW_NVLINK_ERR": "follow the NVLink error workflow",
    "WORKFLOW_NVLINK5_ERR": "follow the NVLink 5 error workflow",
    "WORKFLOW_XID_45": "follow the Xid 45 workflow",
    "WORKFLOW_XID_48": "follow the Xid 48 (ECC) workflow",
    "XID_154": "follow the Xid 154 recovery action it reports",
}
"""The Xid catalog's immediate actions (fleetlens/analysis/data/xid_catalog.csv)."""


def diagnosis_name(code: str) -> str:
    """The finding's name in words; a code not in the table reads as its words."""
    return DIAGNOSES.get(code) or code.replace(".", ": ").replace("_", " ").capitalize()


def action_name(code: str) -> str:
    """A catalog action in words, with its code after it (``reboot the node (RESTART_BM)``)."""
    if not code:
        return "none listed"
    words = XID_ACTIONS.get(code)
    return f"{words} ({code})" if words else code
