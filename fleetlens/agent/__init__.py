"""The node agent: GPU samples (NVML or a local dcgm-exporter) and host counters, per node."""
