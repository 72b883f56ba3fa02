"""The node agent: real dcgm-exporter output, NVML through a stand-in, /proc, end to end."""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fleetlens.agent.dcgm import parse_exposition
from fleetlens.agent.host import HostSampler
from fleetlens.agent.nvml import NvmlSampler
from fleetlens.agent.run import Agent
from fleetlens.analysis.hardware import NodeHealth, node_signals
from fleetlens.sdk.config import SDKConfig
from fleetlens.sdk.recorder import Recorder
from fleetlens.store.chdb_store import ChdbStore
from fleetlens.testing import Server, serve_page

pytestmark = pytest.mark.unit

REAL = Path(__file__).resolve().parent / "data" / "real" / "dcgm" / "metrics_scrapes"


def test_dcgm_exporter_scrape_of_an_l4_is_parsed_into_our_columns() -> None:
    gpus = parse_exposition((REAL / "l4_kops_dcgm-exporter_metrics.prom").read_text())
    assert len(gpus) == 1
    g = gpus[0]
    assert (g.node_id, g.gpu, g.gpu_uuid) == (
        "i-030791dc5a37cd257",
        0,
        "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",
    )
    assert g.model == "NVIDIA L4"
    assert g.values["sm_clock"] == 210 and g.values["gpu_temp"] == 31
    assert g.values["power_usage"] == pytest.approx(16.365)
    assert g.values["pcie_replay"] == 0 and g.values["fb_used"] >= 0
    assert "tensor_active" in g.values and "dram_active" in g.values  # DCP profiling fields
    assert g.values["pcie_tx_bytes"] == 112603 and g.values["gr_engine_active"] == 0
    assert "pcie_rx_bytes" in g.values


SCRAPES = {"h100": (REAL / "h100x8_aicr_dcgm-exporter_sampled_lines.prom").read_text()}


def test_dcgm_sampled_h100_node_keeps_each_gpu_and_pod_attribution() -> None:
    gpus = parse_exposition((REAL / "h100x8_aicr_dcgm-exporter_sampled_lines.prom").read_text())
    assert [g.gpu for g in gpus] == list(range(8))
    assert {g.node_id for g in gpus} == {"gpu-node-1"}
    # The agent's node id wins over the exporter's Hostname (the exporter pod's, on
    # Kubernetes): its GPUs were filed under another node than its host samples and placement.
    assert {g.node_id for g in parse_exposition(SCRAPES["h100"], node="n9")} == {"n9"}
    assert gpus[0].attribution["pod"].startswith("vllm-agg-0")
    # MEM_COPY_UTIL is only in the excerpt for gpus 0-5.
    assert [("mem_copy_util" in g.values) for g in gpus] == [True] * 6 + [False] * 2
    l40s = parse_exposition((REAL / "l40s_upcloud_dcgm-exporter_metrics.prom").read_text())
    assert len(l40s) == 1 and l40s[0].values["gpu_temp"] > 0


def test_dcgm_parser_skips_garbage_lines() -> None:
    text = 'DCGM_FI_DEV_GPU_TEMP{gpu="x"} 3\nnot a metric\nDCGM_FI_DEV_GPU_TEMP{gpu="1"} NaN\n'
    (g,) = parse_exposition(text, node="n7")
    assert g.node_id == "n7" and g.gpu == 1 and math.isnan(g.values["gpu_temp"])


class _NotSupported(Exception):
    pass


class FakeNvml:
    """A stand-in for pynvml with the same function names (these machines have no GPU)."""

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    NVML_VOLATILE_ECC, NVML_NVLINK_ERROR_DL_CRC_FLIT, NVML_NVLINK_MAX_LINKS = 0, 2, 4
    nvmlEventTypeXidCriticalError = 8

    def __init__(self) -> None:
        self.events: list[Any] = []

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def nvmlDeviceGetUUID(self, h: str) -> bytes:
        return f"GPU-{h}".encode()

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        return 71 if h == "h1" else 45

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 612_500  # milliwatts

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:
        return 700_000

    def nvmlDeviceGetClockInfo(self, h: str, kind: int) -> int:
        return {1: 1410 if h == "h1" else 1980, 2: 2619}[kind]

    def nvmlDeviceGetMaxClockInfo(self, h: str, kind: int) -> int:
        return 1980

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return SimpleNamespace(gpu=97, memory=41)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return SimpleNamespace(used=60 << 30, free=20 << 30)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        return 0x20 if h == "h1" else 0  # SW thermal slowdown on GPU 1

    def nvmlDeviceGetTotalEccErrors(self, h: str, kind: int, counter: int) -> int:
        return 12 if kind == 0 else 0

    def nvmlDeviceGetPcieReplayCounter(self, h: str) -> int:
        raise _NotSupported()

    def nvmlDeviceGetNvLinkErrorCounter(self, h: str, link: int, counter: int) -> int:
        if link >= 2:
            raise _NotSupported()
        return 3

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceRegisterEvents(self, h: str, kinds: int, s: str) -> None:
        pass

    def nvmlEventSetWait_v2(self, s: str, timeout_ms: int) -> Any:
        if not self.events:
            raise _NotSupported("timeout")
        return self.events.pop(0)


def test_nvml_sampler_maps_fields_units_and_xid_events() -> None:
    nv = FakeNvml()
    sampler = NvmlSampler(nv, "node-3")
    nv.events.append(SimpleNamespace(device="h1", eventData=79))
    a, b = sampler.sample(1.7e9)
    assert (b["gpu"], b["gpu_uuid"], b["node_id"]) == (1, "GPU-h1", "node-3")
    assert b["power_usage"] == 612.5 and b["power_limit"] == 700.0
    assert (b["sm_clock"], b["sm_clock_max"], b["gpu_temp"]) == (1410, 1980, 71)
    assert b["throttle_reasons"] == 0x20 and b["ecc_sbe_total"] == 12
    assert b["fb_used"] == 60 * 1024 and b["nvlink_crc_errors"] == 6  # links 0 and 1
    assert b["xid"] == 79 and math.isnan(a["xid"])
    assert math.isnan(a["pcie_replay"])  # not supported: NaN, not an error


def test_host_sampler_reads_proc(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "stat").write_text("cpu  100 0 100 800 0 0 0 0 0 0\n")
    (proc / "loadavg").write_text("3.50 2.00 1.00 1/100 999\n")
    (proc / "meminfo").write_text("MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 400 kB\n")
    (proc / "diskstats").write_text(
        "   8       0 sda 10 0 2048 0 5 0 1024 0 0 0 0\n"
        "   8       1 sda1 10 0 2048 0 5 0 1024 0 0 0 0\n"
        " 259       0 nvme0n1 1 0 8 0 1 0 16 0 0 0 0\n"
    )
    (proc / "net" / "dev").write_text(
        "Inter-|   Receive\n face |bytes packets errs drop fifo frame compressed multicast|\n"
        "    lo: 999 1 0 0 0 0 0 0 999 1 0 0 0 0 0 0\n"
        "  eth0: 5000 10 1 2 0 0 0 0 7000 20 3 4 0 0 0 0\n"
    )
    (proc / "net" / "snmp").write_text("Tcp: RtoAlgorithm RetransSegs\nTcp: 1 42\n")
    h = HostSampler("n1", str(proc))
    h.sample(1.0)
    (proc / "stat").write_text("cpu  150 0 150 900 0 0 0 0 0 0\n")
    s = h.sample(2.0)
    assert s["cpu_util"] == pytest.approx(0.5)
    assert (s["load1"], s["mem_used_bytes"], s["mem_total_bytes"]) == (3.5, 600 * 1024, 1000 * 1024)
    assert (s["disk_read_bytes"], s["disk_write_bytes"]) == ((2048 + 8) * 512, (1024 + 16) * 512)
    assert (s["net_rx_bytes"], s["net_tx_bytes"], s["nic_errors"]) == (5000, 7000, 10)
    assert s["tcp_retransmits"] == 42


def _infiniband(sys_root: Path, ports: dict[str, dict[str, dict[str, int]]]) -> None:
    """A /sys/class/infiniband tree as the kernel lays it out (this machine has no HCA)."""
    for dev, dirs in ports.items():
        for sub, counters in dirs.items():
            d = sys_root / "class" / "infiniband" / dev / "ports" / "1" / sub
            d.mkdir(parents=True, exist_ok=True)
            for name, value in counters.items():
                (d / name).write_text(f"{value}\n")


def test_host_sampler_reads_infiniband_ports(tmp_path: Path) -> None:
    _infiniband(tmp_path / "sys", {
        "mlx5_0": {"counters": {"port_xmit_data": 1000, "port_rcv_data": 2000,
                                "symbol_error": 3, "link_downed": 1, "port_rcv_errors": 0},
                   "hw_counters": {"local_ack_timeout_err": 5, "out_of_sequence": 2}},
        "mlx5_1": {"counters": {"port_xmit_data": 10, "port_rcv_data": 20}},
    })  # fmt: skip
    s = HostSampler("n1", str(tmp_path / "proc"), str(tmp_path / "sys")).sample(1.0)
    # port_*_data count 4-byte words; every port of every device is summed.
    assert (s["ib_tx_bytes"], s["ib_rx_bytes"]) == (4 * 1010, 4 * 2020)
    assert (s["ib_errors"], s["rdma_retries"]) == (4, 7)
    none = HostSampler("n2", str(tmp_path / "proc"), str(tmp_path / "nothing")).sample(1.0)
    assert math.isnan(none["ib_errors"]) and math.isnan(none["ib_tx_bytes"])  # no HCA: NaN


def test_infiniband_errors_are_network_evidence() -> None:
    sigs = node_signals(NodeHealth("n1", samples=5, ib_errors_per_s=2.0, rdma_retries_per_s=4.0))
    assert {s.name for s in sigs} == {"ib_errors", "rdma_retries"}
    assert node_signals(NodeHealth("n1", samples=5, ib_errors_per_s=0.0)) == []


@pytest.mark.e2e
def test_agent_scrapes_dcgm_exporter_and_delivers_to_the_server(tmp_path: Path) -> None:
    scrape = (REAL / "h100x8_aicr_dcgm-exporter_sampled_lines.prom").read_bytes()
    exporter = contextlib.ExitStack()
    url = exporter.enter_context(serve_page(scrape))
    data = str(tmp_path / "data")
    server = Server(data).start()
    try:
        cfg = SDKConfig.resolve(
            {
                "server": server.url,
                "node_id": "gpu-node-1",
                "spool_dir": str(tmp_path / "spool"),
                "install_signal_handler": False,
            },
            {},
        )
        recorder = Recorder(cfg)
        _infiniband(tmp_path / "sys", {"mlx5_0": {"counters": {"port_rcv_data": 7,
                                                               "symbol_error": 2}}})  # fmt: skip
        agent = Agent(
            recorder,
            "gpu-node-1",
            dcgm_url=url,
            sys_root=str(tmp_path / "sys"),
        )
        assert agent.tick() == 9  # the host, and 8 GPUs
        assert recorder.flush(30)
        recorder.close()
        assert recorder.stats()["dropped"] == 0 and agent.errors == 0
    finally:
        server.stop()
        exporter.close()
    store = ChdbStore(f"{data}/telemetry")
    try:
        rows = store.query(
            "SELECT gpu, gpu_uuid, gpu_temp FROM fleetlens.gpu_samples ORDER BY gpu"
        ).to_pylist()
        host = store.query(
            "SELECT node_id, mem_total_bytes, ib_rx_bytes, ib_errors FROM fleetlens.node_samples"
        ).to_pylist()
    finally:
        store.close()
    assert [r["gpu"] for r in rows] == list(range(8))
    assert rows[0]["gpu_uuid"] == "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"
    assert rows[0]["gpu_temp"] == 30
    assert host[0]["node_id"] == "gpu-node-1" and host[0]["mem_total_bytes"] > 0
    assert (host[0]["ib_rx_bytes"], host[0]["ib_errors"]) == (28, 2)
    time.sleep(0)
