"""What the devices a run was placed on said, bound to one tenant: when the run held each node,
which other runs held the same GPUs, the DCGM and host health over a window, when a GPU's error
counter first rose. The node and GPU evidence of a finding comes from here."""

from __future__ import annotations

from typing import Any

import numpy as np

from .reader import TenantReader
from .telemetry import TelemetryStore

__all__ = ["DeviceQueries"]


class DeviceQueries:
    def __init__(self, telemetry: TelemetryStore, tenant: str) -> None:
        self.t = telemetry
        self.db = telemetry.database
        self.r = TenantReader(telemetry, tenant)
        self.tenant = tenant

    def placed(self, run_id: str) -> dict[str, list[tuple[float, float]]]:
        """Node -> when the run was placed on it: per job attempt that put a rank there, from
        its placement (or first step) to its last step end or how it ended (failure, finish,
        preemption), whichever is later. Node and GPU evidence applies to the run only then:
        another run on the same node name at another time is not this run's."""
        rows = self.r.table(
            "SELECT job_id AS q_job, node_id AS q_node, min(time) AS q_t0 FROM {db}.placement"
            " WHERE run_id = {run:String} GROUP BY job_id, node_id",
            run=run_id,
        ).to_pylist()
        spans = {
            r["q_job"]: (float(r["q_t0"]), float(r["q_t1"]))
            for r in self.r.table(
                "SELECT q_job, min(q_t0) AS q_t0, max(q_t1) AS q_t1 FROM ("
                " SELECT job_id AS q_job, min(start) AS q_t0, max(end) AS q_t1"
                " FROM {db}.steps_by_step WHERE run_id = {run:String}"
                " GROUP BY job_id UNION ALL"
                " SELECT job_id AS q_job, max(time) AS q_t0, max(time) AS q_t1 FROM {db}.events"
                " WHERE run_id = {run:String}"
                " AND kind IN ('failure', 'finish', 'preemption') GROUP BY job_id)"
                " GROUP BY q_job",
                run=run_id,
            ).to_pylist()
        }
        out: dict[str, list[tuple[float, float]]] = {}
        for r in rows:
            span = spans.get(r["q_job"])
            if span is not None and r["q_node"]:
                out.setdefault(r["q_node"], []).append((min(float(r["q_t0"]), span[0]), span[1]))
        return out

    def gpu_sharers(
        self, run_id: str, gpus: list[tuple[str, int]], t0: float, t1: float
    ) -> dict[tuple[str, int], list[str]]:
        """(node, GPU) -> the other runs placed on it before ``t1`` that were stepping within
        [t0, t1]: two runs holding one GPU at once (reused node names, a placement mix-up), so
        a fault on it cannot be told to be either's."""
        if not gpus:
            return {}
        rows = self.r.table(
            "SELECT node_id AS s_node, gpu AS s_gpu, run_id AS s_run FROM {db}.placement"
            " WHERE run_id != {run:String}"
            " AND node_id IN {nodes:Array(String)} AND time <= {t1:Float64}"
            " GROUP BY node_id, gpu, run_id",
            run=run_id,
            nodes=sorted({n for n, _ in gpus}),
            t1=t1,
        ).to_pylist()
        wanted = set(gpus)
        rows = [r for r in rows if (r["s_node"], int(r["s_gpu"])) in wanted]
        if not rows:
            return {}
        active = {
            r["a_run"]
            for r in self.r.table(
                "SELECT DISTINCT run_id AS a_run FROM {db}.steps_by_step"
                " WHERE run_id IN {runs:Array(String)}"
                " AND end >= {t0:Float64} AND start <= {t1:Float64}",
                runs=sorted({r["s_run"] for r in rows}),
                t0=t0,
                t1=t1,
            ).to_pylist()
        }
        out: dict[tuple[str, int], list[str]] = {}
        for r in rows:
            if r["s_run"] in active:
                out.setdefault((r["s_node"], int(r["s_gpu"])), []).append(r["s_run"])
        return {k: sorted(v) for k, v in out.items()}

    def gpu_health_rows(self, nodes: list[str], t0: float, t1: float) -> list[dict[str, Any]]:
        """Per GPU of ``nodes`` over [t0, t1]: the DCGM fields the hardware rules read, one row
        per GPU keyed by the fields of :class:`fleetlens.analysis.hardware.GpuHealth`."""
        if not nodes:
            return []
        rows = self.r.table(
            "SELECT node_id AS g_node, gpu AS g_gpu, count() AS g_n,"
            " maxIf(gpu_temp, isFinite(gpu_temp)) AS g_temp,"
            " minIf(sm_clock / sm_clock_max, sm_clock_max > 0) AS g_clock_min,"
            " quantileIf(0.5)(sm_clock / sm_clock_max, sm_clock_max > 0) AS g_clock_med,"
            " groupBitOr(toUInt64(if(isFinite(throttle_reasons), throttle_reasons, 0))) AS g_thr,"
            " maxIf(power_usage, isFinite(power_usage)) AS g_power,"
            " maxIf(ecc_sbe_total, isFinite(ecc_sbe_total))"
            "  - minIf(ecc_sbe_total, isFinite(ecc_sbe_total)) AS g_sbe,"
            " maxIf(ecc_dbe_total, isFinite(ecc_dbe_total))"
            "  - minIf(ecc_dbe_total, isFinite(ecc_dbe_total)) AS g_dbe,"
            " maxIf(ecc_dbe_total, isFinite(ecc_dbe_total)) AS g_dbe_max,"
            # if(): toInt64 runs on every row, the condition after it (NaN: not sampled)
            " groupUniqArrayIf(toInt64(if(isFinite(xid), xid, 0)), isFinite(xid) AND xid > 0)"
            " AS g_xids,"
            " maxIf(nvlink_crc_errors, isFinite(nvlink_crc_errors))"
            "  - minIf(nvlink_crc_errors, isFinite(nvlink_crc_errors)) AS g_crc,"
            " minIf(nvlink_bandwidth, isFinite(nvlink_bandwidth)) AS g_bw_min,"
            " quantileIf(0.5)(nvlink_bandwidth, isFinite(nvlink_bandwidth)) AS g_bw_med,"
            " maxIf(pcie_replay, isFinite(pcie_replay))"
            "  - minIf(pcie_replay, isFinite(pcie_replay)) AS g_pcie"
            " FROM {db}.gpu_samples WHERE"
            " node_id IN {nodes:Array(String)} AND time BETWEEN {t0:Float64} AND {t1:Float64}"
            " GROUP BY node_id, gpu",
            nodes=sorted(set(nodes)),
            t0=t0,
            t1=t1,
        ).to_pylist()
        return [
            {
                "node": r["g_node"],
                "gpu": int(r["g_gpu"]),
                "samples": int(r["g_n"]),
                "temp_max": _f(r["g_temp"]),
                "clock_ratio_min": _f(r["g_clock_min"]),
                "clock_ratio_median": _f(r["g_clock_med"]),
                "throttle": int(r["g_thr"] or 0),
                "power_max": _f(r["g_power"]),
                "sbe_delta": _z(r["g_sbe"]),
                "dbe_delta": max(_z(r["g_dbe"]), _z(r["g_dbe_max"])),
                "xids": tuple(sorted(int(x) for x in r["g_xids"] or [])),
                "nvlink_crc_delta": _z(r["g_crc"]),
                "nvlink_bw_min": _f(r["g_bw_min"]),
                "nvlink_bw_median": _f(r["g_bw_med"]),
                "pcie_replay_delta": _z(r["g_pcie"]),
            }
            for r in rows
        ]

    def node_health_rows(self, nodes: list[str], t0: float, t1: float) -> list[dict[str, Any]]:
        """Per host of ``nodes`` over [t0, t1], keyed by the fields of
        :class:`fleetlens.analysis.hardware.NodeHealth`."""
        if not nodes:
            return []
        rows = self.r.table(
            "SELECT node_id AS h_node, count() AS h_n,"
            " maxIf(cpu_util, isFinite(cpu_util)) AS h_cpu,"
            " maxIf(mem_used_bytes / mem_total_bytes, mem_total_bytes > 0) AS h_mem,"
            " (maxIf(nic_errors, isFinite(nic_errors)) - minIf(nic_errors, isFinite(nic_errors)))"
            "  / greatest(max(time) - min(time), 1e-9) AS h_nic,"
            " (maxIf(tcp_retransmits, isFinite(tcp_retransmits))"
            "  - minIf(tcp_retransmits, isFinite(tcp_retransmits)))"
            "  / greatest(max(time) - min(time), 1e-9) AS h_retx,"
            " (maxIf(ib_errors, isFinite(ib_errors)) - minIf(ib_errors, isFinite(ib_errors)))"
            "  / greatest(max(time) - min(time), 1e-9) AS h_ib,"
            " (maxIf(rdma_retries, isFinite(rdma_retries))"
            "  - minIf(rdma_retries, isFinite(rdma_retries)))"
            "  / greatest(max(time) - min(time), 1e-9) AS h_rdma"
            " FROM {db}.node_samples WHERE"
            " node_id IN {nodes:Array(String)} AND time BETWEEN {t0:Float64} AND {t1:Float64}"
            " GROUP BY node_id",
            nodes=sorted(set(nodes)),
            t0=t0,
            t1=t1,
        ).to_pylist()
        return [
            {
                "node": r["h_node"],
                "samples": int(r["h_n"]),
                "cpu_max": _f(r["h_cpu"]),
                "mem_used_frac_max": _f(r["h_mem"]),
                "nic_errors_per_s": _z(r["h_nic"]) if r["h_n"] > 1 else 0.0,
                "retransmits_per_s": _z(r["h_retx"]) if r["h_n"] > 1 else 0.0,
                "ib_errors_per_s": _z(r["h_ib"]) if r["h_n"] > 1 else 0.0,
                "rdma_retries_per_s": _z(r["h_rdma"]) if r["h_n"] > 1 else 0.0,
            }
            for r in rows
        ]

    def first_rise(self, node: str, gpu: int, column: str, t0: float, t1: float) -> float | None:
        """When a cumulative counter of one GPU (``ecc_sbe_total``, ``nvlink_crc_errors``) first
        read more than its first sample in [t0, t1]: the time of that sample, None if it never
        did."""
        if column not in ("ecc_sbe_total", "nvlink_crc_errors"):
            raise ValueError(
                f"column {column!r} is no GPU counter; use ecc_sbe_total or nvlink_crc_errors"
            )
        rows = self.r.table(
            f"SELECT time AS c_t, {column} AS c_v FROM {{db}}.gpu_samples"
            " WHERE node_id = {node:String} AND gpu = {gpu:Int64}"
            f" AND time BETWEEN {{t0:Float64}} AND {{t1:Float64}} AND isFinite({column})"
            " ORDER BY time",
            node=node,
            gpu=gpu,
            t0=t0,
            t1=t1,
        ).to_pylist()
        if not rows:
            return None
        first = float(rows[0]["c_v"])
        return next((float(r["c_t"]) for r in rows if float(r["c_v"]) > first), None)


def _f(x: Any) -> float:
    return float(x) if x is not None else float("nan")


def _z(x: Any) -> float:
    v = _f(x)
    return v if np.isfinite(v) else 0.0
