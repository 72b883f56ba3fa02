"""PyTorch integration: device-aware step timing, data wait, DDP collectives, training signals.

``pip install 'fleetlens[torch]'``; nothing here is imported by ``import fleetlens``.

    import fleetlens, fleetlens.torch
    run = fleetlens.init(project="llm")
    tr = fleetlens.torch.TorchRun(run, device)
    tr.watch_ddp(ddp_model)                     # every gradient all-reduce: enter and exit
    for i, batch in enumerate(tr.loader(loader)):   # time waiting for the loader
        with tr.step(i, tokens=batch.numel()):
            with tr.phase("forward"): loss = ddp_model(batch)
            with tr.phase("backward"): loss.backward()
            with tr.phase("optimizer"): opt.step()
        tr.log(i, loss=loss, optimizer=opt)

Each concept has its module: ``timing`` (steps, phases, the loader's wait, DDP collectives),
``cuda`` (the same on the device: CUDA events read back later), ``drain`` (the stop vote, drain,
resume), ``checkpoint`` (verified checkpoints and their manifests); ``run`` puts them together
as ``TorchRun``.

Timing never synchronizes the device on the hot path. On CPU, host timers are exact. On CUDA,
steps, phases and collectives are events on the streams that ran the work, read back once the
device has passed them (``query()``), and put on the host's clock through a per-step anchor
event. In DDP the backward pass ends waiting until every rank's gradients are reduced, so its
time is split at the moment the last local bucket was ready (a host timer on CPU, an event on
the computing stream on CUDA): before it is this rank's compute, after it is waiting for the
others (``comm``). A slow rank therefore shows as the longest compute and the shortest wait, and
each collective records when this rank (on CUDA, its device) entered and left it, so the last
arriver is found without synchronized clocks. ``flush()`` at the end of training records what
the device has not yet been seen to finish.

Draining for the server's remediation controller (docs/remediation.md)::

    start, state = tr.resume(ckpt_dir) or (0, None)     # newest verified checkpoint
    for step in range(start, total):
        if tr.stop_requested(step):                     # same answer on every rank
            tr.drain(step, lambda: {"model": ..., "optim": ...}, ckpt_dir)
        ...

``stop_requested`` agrees on the stop step through an all-reduce on a side gloo group, launched
at one vote boundary and read at the next (about four votes a second), so it never waits on the
hot path; ``drain`` writes a
verified checkpoint (rank 0), reports it, and exits with ``DRAIN_EXIT_CODE`` when the server
says the node is out, so torchrun's agents re-form the job without it.
"""

from __future__ import annotations

from ..sdk.control import DRAIN_EXIT_CODE
from .checkpoint import latest_checkpoint, load, save, save_verified
from .run import TorchRun

__all__ = ["DRAIN_EXIT_CODE", "TorchRun", "latest_checkpoint", "load", "save", "save_verified"]
