"""PyTorch profiler (Kineto) trace import: per-rank step breakdown and collectives.

``kineto`` reads a trace, ``breakdown`` and ``collectives`` analyse it (pure functions),
``importer`` turns ranks into wire batches, ``cli`` is ``fleetlens traces import``.
"""
