"""A real one-host Slurm cluster (Debian's slurm-wlm and munge) in a temp dir, for the actuator
tests.

munged on a private socket and key, then slurmctld and slurmd in the foreground, all reading a
generated slurm.conf (``SLURM_CONF``); nothing under /etc is read or written. The node is idle in
about a second. The daemons run as root (slurmd must; ``SlurmUser=root``), as in CI. With
``gpus`` the node has GPUs (sinfo and sacct count them); with ``accounting`` slurmdbd keeps job
records in a private MariaDB, so that ``sacct`` answers (a few seconds more to start)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fleetlens.testing import free_port

INSTALL = "apt-get install slurm-wlm munge slurmdbd mariadb-server (.ci/run does this)"


def binary(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path is None:
        raise RuntimeError(f"{name} is not installed: {INSTALL}")
    return path


def write_conf(
    root: Path,
    *,
    node: str,
    munge_socket: Path,
    ctld_port: int,
    slurmd_port: int,
    message_timeout: int = 10,
    gpus: int = 0,
    dbd_port: int = 0,
) -> Path:
    """A minimal slurm.conf: one node on 127.0.0.1 in one default partition; ``gpus`` gives the
    node that many (counted, not device-backed) GPUs in a gres.conf beside it."""
    conf = root / "slurm.conf"
    gres = ""
    if gpus:
        # slurmd counts a GPU per device file: character devices with NVIDIA's major number
        # stand in for /dev/nvidia0.. (nothing opens them: no cgroups, no task plugin).
        dev = root / "dev"
        dev.mkdir(exist_ok=True)
        for i in range(gpus):
            os.mknod(dev / f"nvidia{i}", stat.S_IFCHR | 0o666, os.makedev(195, i))
        gres = f" Gres=gpu:h100:{gpus}"
        (root / "gres.conf").write_text(
            f"NodeName={node} Name=gpu Type=h100 File={dev}/nvidia[0-{gpus - 1}]\n"
        )
        (root / "gres.conf").chmod(0o644)
    conf.write_text(
        "\n".join(
            [
                "ClusterName=fleetlens",
                # "localhost" is accepted whatever this machine's hostname is.
                "SlurmctldHost=localhost",
                f"SlurmctldPort={ctld_port}",
                f"SlurmdPort={slurmd_port}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={munge_socket}",
                f"StateSaveLocation={root / 'state'}",
                f"SlurmdSpoolDir={root / 'spool'}",
                f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'slurmd.pid'}",
                # No cgroups: the test needs a node to drain, not job containment.
                "ProctrackType=proctrack/pgid",
                "TaskPlugin=task/none",
                "MpiDefault=none",
                "SwitchType=switch/none",
                "MailProg=/bin/true",
                "ReturnToService=2",
                f"MessageTimeout={message_timeout}",
                # Fewer CPUs than the machine has is allowed; more would make the node invalid.
                *(["GresTypes=gpu"] if gpus else []),
                *(
                    [
                        "AccountingStorageType=accounting_storage/slurmdbd",
                        "AccountingStorageHost=127.0.0.1",
                        f"AccountingStoragePort={dbd_port}",
                        # The munge socket of the connection to slurmdbd (AuthInfo is not read).
                        f"AccountingStoragePass={munge_socket}",
                        # GPUs in sacct's AllocTRES, as GPU sites configure it.
                        "AccountingStorageTRES=gres/gpu",
                        "JobAcctGatherType=jobacct_gather/none",
                        "SelectType=select/cons_tres",
                    ]
                    if dbd_port
                    else []
                ),
                f"NodeName={node} NodeAddr=127.0.0.1 CPUs=1{gres} State=UNKNOWN",
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    conf.chmod(0o644)
    return conf


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    node: str
    started_in: float = 0.0
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def client(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (scontrol, sinfo) against this cluster."""
        return subprocess.run(
            [binary(argv[0]), *argv[1:]],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def show_node(self, node: str | None = None) -> str:
        out = self.client("scontrol", "-o", "show", "node", node or self.node)
        if out.returncode != 0:
            raise RuntimeError(f"scontrol show node: {out.stderr.strip()}")
        return out.stdout

    def state(self) -> str:
        """The node's State as scontrol reports it, e.g. ``IDLE`` or ``IDLE+DRAIN``."""
        m = re.search(r"\bState=(\S+)", self.show_node())
        return m.group(1) if m else ""

    def reason(self) -> str:
        """The node's Reason without the ``[user@time]`` Slurm appends."""
        m = re.search(r"\bReason=(.*?) \[[^\]]*\]", self.show_node())
        return m.group(1) if m else ""

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
            for p in sorted(self.root.glob("*.log"))
        )


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env)


def _wait(cluster: SlurmCluster, what: str, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, p in cluster.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited {p.returncode}:\n{cluster.logs()}")
        if done():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} not within {timeout}s:\n{cluster.logs()}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _start_accounting(cluster: SlurmCluster, sock: Path, dbd_port: int, timeout: float) -> None:
    """A private MariaDB, slurmdbd on it (what ``sacct`` reads), and the cluster registered."""
    root, env = cluster.root, cluster.env
    db, db_sock, db_port = root / "db", root / "mysqld.sock", free_port()
    init = subprocess.run(
        [binary("mariadb-install-db"), "--no-defaults", f"--datadir={db}", "--user=root",
         "--auth-root-authentication-method=normal", "--skip-test-db"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if init.returncode != 0:
        raise RuntimeError(f"mariadb-install-db: {init.stderr[-2000:]}")
    cluster.procs["mariadbd"] = _start(
        [binary("mariadbd"), "--no-defaults", f"--datadir={db}", f"--socket={db_sock}",
         f"--port={db_port}", "--bind-address=127.0.0.1", "--user=root",
         f"--pid-file={root / 'mysqld.pid'}", "--skip-log-bin"],
        root / "mariadbd.log", env,
    )  # fmt: skip
    _wait(cluster, "mariadbd's socket", db_sock.exists, timeout)
    conf = root / "slurmdbd.conf"
    conf.write_text(
        "\n".join(
            [
                "AuthType=auth/munge",
                f"AuthInfo=socket={sock}",
                "DbdHost=localhost",
                f"DbdPort={dbd_port}",
                "SlurmUser=root",
                f"PidFile={root / 'slurmdbd.pid'}",
                "StorageType=accounting_storage/mysql",
                "StorageHost=127.0.0.1",
                f"StoragePort={db_port}",
                "StorageUser=root",
                "StorageLoc=slurm_acct_db",
                "",
            ]
        )
    )
    conf.chmod(0o600)  # slurmdbd refuses a config others can read
    # slurmdbd reads slurmdbd.conf beside slurm.conf (SLURM_CONF's directory).
    cluster.procs["slurmdbd"] = _start([binary("slurmdbd"), "-D"], root / "slurmdbd.log", env)

    def registered() -> bool:
        out = cluster.client("sacctmgr", "-i", "add", "cluster", "fleetlens")
        return out.returncode == 0 or "already exists" in (out.stdout + out.stderr)

    _wait(cluster, "slurmdbd taking the cluster", registered, timeout)


@contextlib.contextmanager
def slurm_cluster(
    node: str = "fl-node1", timeout: float = 30.0, gpus: int = 0, accounting: bool = False
) -> Iterator[SlurmCluster]:
    """munged + slurmctld + slurmd with one idle node ``node``; yields the cluster. ``gpus``
    gives the node GPUs; ``accounting`` adds slurmdbd on a private MariaDB, for ``sacct``."""
    if os.geteuid() != 0:
        raise RuntimeError("the Slurm test cluster runs slurmd, which needs root (CI runs as root)")
    munged, slurmctld, slurmd = binary("munged"), binary("slurmctld"), binary("slurmd")
    root = Path(tempfile.mkdtemp(prefix="fleetlens-slurm-"))
    # Other users must reach the config and munge's socket (the permission test runs scontrol
    # as nobody); munged checks that its socket's directory is not writable by them.
    root.chmod(0o755)
    (root / "state").mkdir()
    (root / "spool").mkdir()
    mdir = root / "munge"
    mdir.mkdir(mode=0o711)
    mdir.chmod(0o711)
    key = mdir / "munge.key"
    key.write_bytes(secrets.token_bytes(128))
    key.chmod(0o400)
    sock = mdir / "munge.sock"
    dbd_port = free_port() if accounting else 0
    conf = write_conf(
        root, node=node, munge_socket=sock, ctld_port=free_port(), slurmd_port=free_port(),
        gpus=gpus, dbd_port=dbd_port,
    )  # fmt: skip
    cluster = SlurmCluster(root, conf, node)
    env = cluster.env
    t0 = time.monotonic()
    try:
        cluster.procs["munged"] = _start(
            [
                munged,
                "--foreground",
                f"--socket={sock}",
                f"--key-file={key}",
                f"--pid-file={mdir / 'munged.pid'}",
                f"--seed-file={mdir / 'munged.seed'}",
                f"--log-file={root / 'munged.log'}",
            ],
            root / "munged.out.log",
            env,
        )
        _wait(cluster, "munged's socket", sock.exists, timeout)
        if accounting:
            _start_accounting(cluster, sock, dbd_port, timeout)
        # -i: ignore (absent) saved state; -D: stay in the foreground, logging to stderr.
        cluster.procs["slurmctld"] = _start([slurmctld, "-D", "-i"], root / "slurmctld.log", env)
        cluster.procs["slurmd"] = _start([slurmd, "-D", "-N", node], root / "slurmd.log", env)

        def idle() -> bool:
            return cluster.client("sinfo", "-h", "-n", node, "-o", "%T").stdout.strip() == "idle"

        _wait(cluster, f"node {node} idle", idle, timeout)
        cluster.started_in = time.monotonic() - t0
        yield cluster
    finally:
        for p in reversed(cluster.procs.values()):
            _stop(p)
        shutil.rmtree(root, ignore_errors=True)
