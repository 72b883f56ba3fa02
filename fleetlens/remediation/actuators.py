"""Actuators: what takes a node out, behind one small protocol.

An actuator acts at one ``stage`` of a remediation:

* ``drain`` -- the scheduler stops placing work on the node (Slurm ``scontrol update ...
  state=drain``, Kubernetes cordon). It runs first, as the sequence begins.
* ``remove`` -- the launcher takes the node out of the running job (torchrun elastic: the node's
  agent is stopped, so the others re-form the process group without it). It runs after the
  checkpoint is verified.

``apply`` returns an :class:`Outcome`; it raises nothing (an actuator that fails says why, and
the controller records it). ``pending`` outcomes are completed by the job's answers (the
torchrun actuator's work is done by the node's own workers, which stop their agent when the
server tells them to: no daemon with rights on the node is needed).
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from ..errors import ConfigError

__all__ = [
    "ACTUATORS",
    "Actuator",
    "KubernetesActuator",
    "Outcome",
    "SlurmActuator",
    "TorchrunActuator",
    "build_actuators",
]


@dataclass
class Outcome:
    actuator: str
    stage: str
    node: str
    ok: bool
    detail: str
    at: float
    pending: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Actuator(Protocol):
    name: str
    stage: str  # "drain" or "remove"

    def apply(self, node: str, reason: str) -> Outcome: ...


class TorchrunActuator:
    """torchrun elastic: the node's agent is stopped by the node's workers (their parent).

    The controller publishes ``remove`` for the node on the run's control channel; each worker
    there answers ``agent_stopping`` and sends SIGTERM to its agent, which stops its workers and
    leaves the rendezvous. The remaining agents restart their workers (which exit with the drain
    status) and re-form the job at the smaller world size."""

    name = "torchrun"
    stage = "remove"

    def apply(self, node: str, reason: str) -> Outcome:
        return Outcome(
            self.name,
            self.stage,
            node,
            True,
            "asked the node's workers to stop their torchrun agent",
            time.time(),
            pending=True,
        )


class SlurmActuator:
    """``scontrol update nodename=<node> state=drain reason=<reason>``.

    Needs ``scontrol`` on the server host and a Slurm user allowed to drain nodes (SlurmUser or
    an operator: see docs/remediation.md)."""

    name = "slurm"
    stage = "drain"

    def __init__(self, scontrol: str = "scontrol", timeout: float = 30.0) -> None:
        self.scontrol = scontrol
        self.timeout = timeout

    def command(self, node: str, reason: str) -> list[str]:
        # Slurm keeps the reason with the node (``sinfo -R``); keep it short and one line.
        why = " ".join(reason.split())[:200] or "fleetlens"
        return [self.scontrol, "update", f"nodename={node}", "state=drain", f"reason={why}"]

    def apply(self, node: str, reason: str) -> Outcome:
        argv = self.command(node, reason)
        exe = shutil.which(argv[0])
        if exe is None:
            return Outcome(
                self.name,
                self.stage,
                node,
                False,
                f"{argv[0]} not found on the server's PATH",
                time.time(),
            )
        try:
            out = subprocess.run(
                [exe, *argv[1:]], capture_output=True, text=True, timeout=self.timeout
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Outcome(self.name, self.stage, node, False, f"scontrol: {exc}", time.time())
        text = (out.stderr or out.stdout).strip()
        if out.returncode != 0:
            return Outcome(
                self.name,
                self.stage,
                node,
                False,
                f"scontrol exited {out.returncode}: {text[:500]}",
                time.time(),
            )
        return Outcome(
            self.name, self.stage, node, True, f"drained in Slurm: {' '.join(argv)}", time.time()
        )


class KubernetesActuator:
    """Cordon the node: ``PATCH /api/v1/nodes/<node>`` with ``{"spec": {"unschedulable": true}}``
    (a strategic-merge patch, what ``kubectl cordon`` sends).

    Inside a cluster it uses the pod's service account (``KUBERNETES_SERVICE_HOST``, the token and
    CA under ``/var/run/secrets/kubernetes.io/serviceaccount``); elsewhere pass ``api_url`` and
    ``token``. The role needs ``patch`` on ``nodes``."""

    name = "kubernetes"
    stage = "drain"
    SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

    def __init__(
        self,
        api_url: str = "",
        token: str = "",
        ca_file: str = "",
        timeout: float = 10.0,
    ) -> None:
        if not api_url and os.environ.get("KUBERNETES_SERVICE_HOST"):
            host = os.environ["KUBERNETES_SERVICE_HOST"]
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if ":" in host:  # an IPv6 cluster's service address
                host = f"[{host}]"
            api_url = f"https://{host}:{port}"
            if not token and os.path.exists(f"{self.SA_DIR}/token"):
                with open(f"{self.SA_DIR}/token") as fh:
                    token = fh.read().strip()
            if not ca_file and os.path.exists(f"{self.SA_DIR}/ca.crt"):
                ca_file = f"{self.SA_DIR}/ca.crt"
        if not api_url:
            raise ConfigError(
                "the kubernetes actuator needs the API server: run the server in the cluster "
                "or set FLEETLENS_KUBERNETES_API (and FLEETLENS_KUBERNETES_TOKEN)"
            )
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.context = ssl.create_default_context(cafile=ca_file or None)
        self.timeout = timeout

    def apply(self, node: str, reason: str) -> Outcome:
        url = f"{self.api_url}/api/v1/nodes/{urllib.parse.quote(node, safe='')}"
        body = json.dumps({"spec": {"unschedulable": True}}).encode()
        headers = {"Content-Type": "application/strategic-merge-patch+json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, data=body, headers=headers, method="PATCH")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as r:
                doc = json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")[:300]
            return Outcome(
                self.name,
                self.stage,
                node,
                False,
                f"PATCH {url}: HTTP {exc.code} {text}",
                time.time(),
            )
        except (OSError, ValueError) as exc:
            return Outcome(self.name, self.stage, node, False, f"PATCH {url}: {exc}", time.time())
        cordoned = bool(doc.get("spec", {}).get("unschedulable"))
        return Outcome(
            self.name,
            self.stage,
            node,
            cordoned,
            "cordoned (spec.unschedulable=true)"
            if cordoned
            else "the API server answered without spec.unschedulable",
            time.time(),
        )


ACTUATORS = ("torchrun", "slurm", "kubernetes")


def build_actuators(names: str, env: dict[str, str] | None = None) -> list[Actuator]:
    """Actuators from a comma-separated list, e.g. ``"slurm,torchrun"``."""
    env = dict(os.environ if env is None else env)
    out: list[Actuator] = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name == "torchrun":
            out.append(TorchrunActuator())
        elif name == "slurm":
            out.append(SlurmActuator(env.get("FLEETLENS_SCONTROL", "scontrol")))
        elif name == "kubernetes":
            out.append(
                KubernetesActuator(
                    env.get("FLEETLENS_KUBERNETES_API", ""),
                    env.get("FLEETLENS_KUBERNETES_TOKEN", ""),
                    env.get("FLEETLENS_KUBERNETES_CA", ""),
                )
            )
        else:
            raise ConfigError(f"unknown actuator {name!r}; use some of {', '.join(ACTUATORS)}")
    return out
