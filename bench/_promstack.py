"""Real Alertmanager and Prometheus (Debian's packages) on loopback, for the alerting tests and
``bench/alerting.py``.

It lives in ``bench/`` because benchmarks never import ``tests/``; tests import it as
``bench._promstack`` (the repository root is on their path).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fleetlens.testing import free_port


def _binary(*names: str) -> str:
    for n in names:
        path = shutil.which(n)
        if path:
            return path
    raise RuntimeError(
        f"none of {names} is installed: apt-get install prometheus prometheus-alertmanager "
        "(.ci/run does this)"
    )


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(url, timeout=1).read()
            return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def alertmanager(webhook_url: str | None = None) -> Iterator[str]:
    """An Alertmanager; yields its URL. Alerts are routed to ``webhook_url`` if given."""
    root = Path(tempfile.mkdtemp(prefix="fleetlens-am-"))
    port = free_port()
    receiver: dict[str, Any] = {"name": "hook"}
    if webhook_url:
        receiver["webhook_configs"] = [{"url": webhook_url, "send_resolved": True}]
    config = {
        "route": {
            "receiver": "hook",
            "group_wait": "0s",
            "group_interval": "1s",
            "repeat_interval": "1h",
            "group_by": ["alertname", "run_id"],
        },
        "receivers": [receiver],
    }
    (root / "am.yml").write_text(json.dumps(config))
    log = root / "am.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [
                _binary("prometheus-alertmanager", "alertmanager"),
                f"--config.file={root / 'am.yml'}",
                f"--storage.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url + "/-/ready", proc, log)
        yield url
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def prometheus(target: str, rules: str | None = None) -> Iterator[str]:
    """A Prometheus scraping ``target`` (host:port) every second; yields its URL."""
    root = Path(tempfile.mkdtemp(prefix="fleetlens-prom-"))
    port = free_port()
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "fleetlens", "static_configs": [{"targets": [target]}]}],
    }
    if rules:
        (root / "rules.yml").write_text(rules)
        config["rule_files"] = [str(root / "rules.yml")]
    (root / "prom.yml").write_text(json.dumps(config))
    log = root / "prom.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [
                _binary("prometheus"),
                f"--config.file={root / 'prom.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url + "/-/ready", proc, log)
        yield url
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)
