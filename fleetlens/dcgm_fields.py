"""The DCGM fields a GPU sample stores: dcgm-exporter's ``DCGM_FI_*`` counters by the column
of the ``gpu`` record kind that holds each (:data:`fleetlens.schema.GPU`; NaN = not sampled)."""

from __future__ import annotations

__all__ = ["DCGM_FIELDS"]

DCGM_FIELDS: dict[str, str] = {
    "gpu_temp": "DCGM_FI_DEV_GPU_TEMP",
    "memory_temp": "DCGM_FI_DEV_MEMORY_TEMP",
    "power_usage": "DCGM_FI_DEV_POWER_USAGE",
    "power_limit": "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    "sm_clock": "DCGM_FI_DEV_SM_CLOCK",
    "sm_clock_max": "DCGM_FI_DEV_MAX_SM_CLOCK",
    "mem_clock": "DCGM_FI_DEV_MEM_CLOCK",
    "gpu_util": "DCGM_FI_DEV_GPU_UTIL",
    "mem_copy_util": "DCGM_FI_DEV_MEM_COPY_UTIL",
    "fb_used": "DCGM_FI_DEV_FB_USED",
    "fb_free": "DCGM_FI_DEV_FB_FREE",
    "throttle_reasons": "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "ecc_sbe_total": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "ecc_dbe_total": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "xid": "DCGM_FI_DEV_XID_ERRORS",
    "pcie_replay": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "nvlink_bandwidth": "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "nvlink_crc_errors": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "sm_active": "DCGM_FI_PROF_SM_ACTIVE",
    "tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    # DCGM profiling (DCP) fields of seed 001 s5/s7: occupancy, pipes, engine, PCIe and NVLink
    "sm_occupancy": "DCGM_FI_PROF_SM_OCCUPANCY",
    "gr_engine_active": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "fp16_active": "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "fp32_active": "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "fp64_active": "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "pcie_tx_bytes": "DCGM_FI_PROF_PCIE_TX_BYTES",
    "pcie_rx_bytes": "DCGM_FI_PROF_PCIE_RX_BYTES",
    "nvlink_tx_bytes": "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "nvlink_rx_bytes": "DCGM_FI_PROF_NVLINK_RX_BYTES",
    # memory row remapping (a GPU that needs a reset to remap: seed 001 s12)
    "row_remap_pending": "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "row_remap_failure": "DCGM_FI_DEV_ROW_REMAP_FAILURE",
}
