"""Compute and waiting told apart with no code of the user's: ``fleetlens.init`` in a torch job.

In DDP the all-reduce ends inside ``loss.backward()``: a rank that finished its gradients early
waits there for the slow one, so timing phases alone makes every rank's backward equally long and
the slow rank invisible. When ``fleetlens.init`` runs in a process that has loaded torch and is
one of several ranks, :func:`install` watches the first DistributedDataParallel (or FSDP) model
the job calls (a global forward pre-hook, removed as soon as it has found one, or after
:data:`_LOOK_CALLS` module calls without finding one) and then, on every backward pass:

- a post-accumulate-grad hook on each of its parameters stamps when this rank's last gradient
  was ready (the end of its own compute);
- a callback queued on the autograd engine, re-queued once so that it runs after DDP's own
  (which waits for the all-reduce), stamps when backward really returned.

The difference is this rank's wait for the others: the step's ``comm`` phase. A ``backward``
phase the user timed is shortened by it (:meth:`GradClock.take`), so compute (forward +
backward + optimizer) is the rank's own work and the slow rank shows as the longest compute and
the shortest wait, whether it is timed by the README's phases, the Hugging Face or Lightning
callbacks (steps only: compute is the step less its wait) or nothing else.

Host clocks are exact on CPU (gloo blocks the host in backward). On CUDA the host returns
before the device has computed or reduced anything, so a CUDA model is left alone: time it with
``fleetlens.torch.TorchRun`` (device events). Never raises into training; costs one Python call
per parameter per backward and two per step.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ..sdk.run import Run

__all__ = ["install", "uninstall"]

_LOOK_CALLS = 10_000
_perf = time.perf_counter


class Watch:
    """The global hook that looks for the job's data-parallel model, and what it attached."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.calls = 0
        self.model: Any = None
        self.handles: list[Any] = []
        self.look: Any = None

    def __call__(self, module: torch.nn.Module, args: Any) -> None:
        try:
            self.calls += 1
            if _data_parallel(module):
                self._attach(module)
            if self.model is not None or self.calls >= _LOOK_CALLS:
                self.stop_looking()
        except Exception:
            self.run._internal_error()

    def stop_looking(self) -> None:
        look, self.look = self.look, None
        if look is not None:
            look.remove()

    def _attach(self, module: torch.nn.Module) -> None:
        params = [p for p in module.parameters() if p.requires_grad]
        if not params or any(p.device.type != "cpu" for p in params):
            return  # CUDA: host clocks say nothing of the device (TorchRun times it)
        self.model = module
        clock = self.run._grads
        if clock is None:
            return
        hook = clock.tick
        self.handles = [p.register_post_accumulate_grad_hook(hook) for p in params]  # type: ignore[no-untyped-call]

    def remove(self) -> None:
        self.stop_looking()
        for h in self.handles:
            h.remove()
        self.handles = []


class GradClock:
    """When this rank's last gradient was ready and when backward returned, per pass."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.last = 0.0
        self.queued = False
        self._engine = torch.autograd.Variable._execution_engine

    def tick(self, _param: torch.Tensor) -> None:
        try:
            self.last = _perf()
            if not self.queued:
                self.queued = True
                self._engine.queue_callback(self._after_graph)
        except Exception:
            self.run._internal_error()

    def _after_graph(self) -> None:
        # DDP queued its own callback (which waits for the all-reduce) while the graph ran:
        # one more turn runs this after it.
        try:
            self._engine.queue_callback(self._returned)
        except Exception:
            self.queued = False
            self.run._internal_error()

    def _returned(self) -> None:
        self.queued = False
        try:
            wait = _perf() - self.last
            if wait > 0:
                self.run._waited(wait)
        except Exception:
            self.run._internal_error()


def _data_parallel(module: torch.nn.Module) -> bool:
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        return True
    fsdp = getattr(torch.distributed, "fsdp", None)
    cls = getattr(fsdp, "FullyShardedDataParallel", None) if fsdp is not None else None
    return cls is not None and isinstance(module, cls)


def install(run: Run) -> Watch | None:
    """Watch this process's data-parallel model for ``run`` (see the module's doc)."""
    try:
        if not torch.distributed.is_available() or run.config.world_size < 2:
            return None
        from torch.nn.modules.module import register_module_forward_pre_hook

        run._grads = GradClock(run)
        watch = Watch(run)
        watch.look = register_module_forward_pre_hook(watch)
        return watch
    except Exception:
        run._internal_error()
        return None


def uninstall(run: Run) -> None:
    """Stop timing backward here: another timer (TorchRun) splits it."""
    try:
        watch = getattr(run, "_watch", None)
        if hasattr(run, "_grads"):
            run._grads = None
        if watch is not None:
            watch.remove()
            run._watch = None
    except Exception:
        pass
