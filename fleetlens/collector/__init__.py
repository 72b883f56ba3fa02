"""The collector: decode and validate batches, store them durably, then acknowledge."""
