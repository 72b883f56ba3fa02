"""The scheduler actuators against real peers.

Slurm: a real one-host cluster (slurmctld, slurmd, munge) from tests/slurmstack.py; the node is
drained by the real ``scontrol`` and read back from the controller. Kubernetes: no API server
runs here, so a loopback HTTP(S) server answers the one call the actuator makes the way the API
server does (method, path, content type, bearer token, Status objects on failure)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleetlens.errors import ConfigError
from fleetlens.remediation.actuators import (
    KubernetesActuator,
    SlurmActuator,
    TorchrunActuator,
    build_actuators,
)
from fleetlens.testing import free_port

from .slurmstack import SlurmCluster, binary, slurm_cluster, write_conf

pytestmark = pytest.mark.unit

REASON = "fleetlens #1: fatal_xid"

# --- Slurm -------------------------------------------------------------------------------------


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    with slurm_cluster() as cluster:
        # The actuator's scontrol inherits the server's environment, as it would in production.
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        yield cluster


@pytest.mark.e2e
def test_slurm_drains_the_node_with_our_reason(slurm: SlurmCluster) -> None:
    assert slurm.state() == "IDLE"

    out = SlurmActuator().apply(slurm.node, REASON)

    assert (out.actuator, out.stage, out.node, out.ok, out.pending) == (
        "slurm",
        "drain",
        slurm.node,
        True,
        False,
    )
    assert out.detail.startswith("drained in Slurm: scontrol update nodename=fl-node1 state=drain")
    assert slurm.state() == "IDLE+DRAIN"
    assert slurm.reason() == REASON
    sinfo = slurm.client("sinfo", "-R", "-h", "-N", "-o", "%N|%T|%E").stdout.strip()
    assert sinfo == f"{slurm.node}|drained|{REASON}"

    # Slurm keeps one line per node: a multi-line reason is folded, a long one cut at 200.
    again = SlurmActuator().apply(slurm.node, "fleetlens #2:\n  ecc_uncorrectable\t" + "x" * 300)
    assert again.ok, again.detail
    assert slurm.reason() == ("fleetlens #2: ecc_uncorrectable " + "x" * 300)[:200]


@pytest.mark.e2e
def test_slurm_unknown_node_fails_with_scontrols_error(slurm: SlurmCluster) -> None:
    out = SlurmActuator().apply("no-such-node", REASON)

    assert not out.ok
    assert out.detail == "scontrol exited 1: slurm_update error: Invalid node name specified"
    assert slurm.state() == "IDLE"


@pytest.mark.e2e
def test_slurm_refuses_a_user_who_is_not_an_operator(slurm: SlurmCluster, tmp_path: Path) -> None:
    # What a server running as an ordinary user gets: the controller (munge-authenticated uid)
    # says no, and the outcome carries it. runuser keeps the environment, SLURM_CONF included.
    wrapper = tmp_path / "scontrol-as-nobody"
    wrapper.write_text(f'#!/bin/sh\nexec runuser -u nobody -- {binary("scontrol")} "$@"\n')
    wrapper.chmod(0o755)

    out = SlurmActuator(str(wrapper)).apply(slurm.node, REASON)

    assert not out.ok
    # Slurm's words for it; the controller's log names the refused RPC.
    assert out.detail == "scontrol exited 1: slurm_update error: Invalid user id"
    assert slurm.state() == "IDLE"
    deadline = time.monotonic() + 30
    while "Security violation, UPDATE_NODE RPC from uid=65534" not in slurm.logs():
        assert time.monotonic() < deadline, slurm.logs()
        time.sleep(0.05)


@pytest.mark.e2e
def test_slurm_controller_unreachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real scontrol with a config whose controller is not running (nothing on that port).
    conf = write_conf(
        tmp_path,
        node="fl-node1",
        munge_socket=tmp_path / "munge.sock",
        ctld_port=free_port(),
        slurmd_port=free_port(),
        message_timeout=1,
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))

    out = SlurmActuator().apply("fl-node1", REASON)

    assert not out.ok
    assert "Unable to contact slurm controller" in out.detail, out.detail


def test_slurm_without_scontrol_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))

    out = SlurmActuator().apply("fl-node1", REASON)

    assert not out.ok
    assert out.detail == "scontrol not found on the server's PATH"
    assert not SlurmActuator("/opt/slurm/bin/scontrol").apply("fl-node1", REASON).ok


# --- Kubernetes --------------------------------------------------------------------------------

TOKEN = "sa-token-7f3a"


UNKNOWN_FORMAT = (
    "the body of the request was in an unknown format - accepted media types include: "
    "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, "
    "application/strategic-merge-patch+json"
)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class ApiServer(ThreadingHTTPServer):
    """The Kubernetes API server's answer to ``PATCH /api/v1/nodes/<name>`` and nothing more."""

    token = TOKEN
    nodes: dict[str, dict[str, Any]]


class _V6ApiServer(ApiServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: ApiServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, code: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PATCH(self) -> None:
        patch = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Authorization") != f"Bearer {self.server.token}":
            self._answer(401, _status(401, "Unauthorized", "Unauthorized"))
            return
        m = re.fullmatch(r"/api/v1/nodes/([^/?]+)", self.path)
        if m is None:
            self._answer(404, _status(404, "NotFound", "the server could not find the resource"))
            return
        if self.headers.get("Content-Type") != "application/strategic-merge-patch+json":
            self._answer(415, _status(415, "UnsupportedMediaType", UNKNOWN_FORMAT))
            return
        name = m.group(1)
        node = self.server.nodes.get(name)
        if node is None:
            self._answer(404, _status(404, "NotFound", f'nodes "{name}" not found'))
            return
        node["spec"].update(json.loads(patch)["spec"])
        self._answer(200, node)


@contextlib.contextmanager
def api_server(
    tls: tuple[Path, Path] | None = None, host: str = "127.0.0.1"
) -> Iterator[ApiServer]:
    cls = _V6ApiServer if ":" in host else ApiServer
    httpd = cls((host, 0), _Handler)
    httpd.nodes = {
        "gpu-node-7": {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"name": "gpu-node-7"},
            "spec": {"podCIDR": "10.244.7.0/24"},
        }
    }
    if tls is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(tls[0]), str(tls[1]))
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def _url(httpd: ApiServer, scheme: str = "http") -> str:
    host, port = httpd.server_address[:2]
    assert isinstance(host, str)
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def _cordoned(httpd: ApiServer) -> bool:
    return httpd.nodes["gpu-node-7"]["spec"].get("unschedulable") is True


@pytest.fixture
def cert(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and ::1: the cluster CA and the server's cert."""
    crt, key = tmp_path / "server.crt", tmp_path / "server.key"
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl is not installed: apt-get install openssl")
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "1", "-subj", "/CN=kubernetes",
            "-addext", "subjectAltName=IP:127.0.0.1,IP:::1",
            "-keyout", str(key), "-out", str(crt),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return crt, key


@pytest.fixture
def in_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty service-account directory the actuator reads instead of the pod's."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    monkeypatch.setattr(KubernetesActuator, "SA_DIR", str(sa))
    return sa


def test_kubernetes_cordons_the_node() -> None:
    with api_server() as httpd:
        out = KubernetesActuator(api_url=_url(httpd), token=TOKEN).apply("gpu-node-7", REASON)

        assert (out.actuator, out.stage, out.node, out.ok) == (
            "kubernetes",
            "drain",
            "gpu-node-7",
            True,
        )
        assert out.detail == "cordoned (spec.unschedulable=true)"
        assert _cordoned(httpd)
        assert httpd.nodes["gpu-node-7"]["spec"]["podCIDR"] == "10.244.7.0/24"  # merged


def test_kubernetes_unknown_node_fails_with_the_api_servers_message() -> None:
    with api_server() as httpd:
        url = _url(httpd)
        out = KubernetesActuator(api_url=url + "/", token=TOKEN).apply("gpu-node-99", REASON)

        assert not out.ok
        assert out.detail.startswith(f"PATCH {url}/api/v1/nodes/gpu-node-99: HTTP 404 ")
        assert json.loads(out.detail.split("HTTP 404 ", 1)[1])["message"] == (
            'nodes "gpu-node-99" not found'
        )


@pytest.mark.parametrize("token", ["", "someone-elses-token"])
def test_kubernetes_without_the_right_token_is_refused(token: str) -> None:
    with api_server() as httpd:
        out = KubernetesActuator(api_url=_url(httpd), token=token).apply("gpu-node-7", REASON)

        assert not out.ok
        assert "HTTP 401" in out.detail
        assert not _cordoned(httpd)


@pytest.mark.e2e
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_kubernetes_in_cluster_uses_the_service_account(
    host: str,
    cert: tuple[Path, Path],
    in_cluster: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (in_cluster / "token").write_text(TOKEN + "\n")
    shutil.copy(cert[0], in_cluster / "ca.crt")
    with api_server(tls=cert, host=host) as httpd:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(httpd.server_address[1]))

        actuator = KubernetesActuator()
        out = actuator.apply("gpu-node-7", REASON)

        assert actuator.api_url == _url(httpd, "https")
        assert out.ok, out.detail
        assert _cordoned(httpd)


@pytest.mark.e2e
def test_kubernetes_in_cluster_verifies_the_api_server_against_the_ca(
    cert: tuple[Path, Path], in_cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (in_cluster / "token").write_text(TOKEN)  # no ca.crt: the system's CAs do not know this one
    with api_server(tls=cert) as httpd:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(httpd.server_address[1]))

        out = KubernetesActuator().apply("gpu-node-7", REASON)

        assert not out.ok
        assert "CERTIFICATE_VERIFY_FAILED" in out.detail, out.detail
        assert not _cordoned(httpd)


def test_kubernetes_unconfigured_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="FLEETLENS_KUBERNETES_API"):
        KubernetesActuator()
    with pytest.raises(ConfigError, match="FLEETLENS_KUBERNETES_API"):
        build_actuators("torchrun,kubernetes", env={})


# --- build_actuators ---------------------------------------------------------------------------


def test_build_actuators_in_the_order_given() -> None:
    got = build_actuators(" slurm , ,torchrun", env={"FLEETLENS_SCONTROL": "/opt/slurm/scontrol"})

    assert [(a.name, a.stage) for a in got] == [("slurm", "drain"), ("torchrun", "remove")]
    assert isinstance(got[0], SlurmActuator) and got[0].scontrol == "/opt/slurm/scontrol"
    assert isinstance(got[1], TorchrunActuator)
    assert build_actuators("", env={}) == []


def test_build_actuators_kubernetes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with api_server() as httpd:
        env = {"FLEETLENS_KUBERNETES_API": _url(httpd), "FLEETLENS_KUBERNETES_TOKEN": TOKEN}
        (actuator,) = build_actuators("kubernetes", env=env)

        assert actuator.apply("gpu-node-7", REASON).ok
        assert _cordoned(httpd)


def test_build_actuators_unknown_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"unknown actuator 'pbs'; use some of torchrun, slurm"):
        build_actuators("slurm,pbs", env={})
