"""``TorchRun``: a fleetlens Run with PyTorch-aware timing, draining and training signals."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..sdk.memory import MemorySampler
from ..sdk.run import Run
from . import flight_recorder as fr
from .auto import uninstall
from .capture import ensure_capture
from .cuda import CudaApi
from .drain import Drain
from .timing import StepTiming


def _item(x: Any) -> float:
    if isinstance(x, torch.Tensor):
        return float(x.detach().float().item())
    return float(x)


class TorchRun(StepTiming, Drain):
    """A fleetlens Run with PyTorch-aware timing. Never raises into the training loop."""

    def __init__(
        self,
        run: Run,
        device: torch.device | str | None = None,
        event_factory: Any = None,
        *,
        cuda_api: CudaApi | None = None,
    ) -> None:
        """``device``: where the model runs; on ``cuda`` the timing is device events.

        ``event_factory`` replaces ``torch.cuda.Event``; ``cuda_api`` replaces all of what the
        device timing uses of CUDA and the host clock (``fleetlens.torch.cuda.CudaApi``): tests
        pass a model of a GPU here. Leave both unset on a GPU host."""
        self.errors = 0
        uninstall(run)  # TorchRun splits backward itself (DDP comm hook, device events)
        self._init_timing(run, device, event_factory, cuda_api)
        self._memory = MemorySampler()
        if self.cuda:  # "cuda" alone is the training thread's current device
            self._memory.note_device()
            if self.device.index is not None:
                self._memory.device = self.device.index
        self._init_drain()
        self._watch_hangs()
        # a channel that only offers captures; stop_requested() makes it the drain's too
        ensure_capture(run)

    def _watch_hangs(self) -> None:
        """With the flight recorder on, dump and upload it when this job hangs
        (:mod:`fleetlens.torch.flight_recorder`)."""
        try:
            cfg = getattr(self.run, "config", None)  # a stand-in run may have none
            if cfg is None or not cfg.enabled or not fr.enabled():
                return  # fleetlens disabled, or no recorder buffer to dump
            if cfg.world_size < 2:
                return
            where = fr.dump_dir(cfg.run_id, cfg.job_id)
            self.hang_dump = fr.HangDump(self.run, cfg.rank, cfg.world_size, where).start()
        except Exception:
            self.errors += 1

    # -- training signals -----------------------------------------------------------------------

    def log(
        self,
        step: int,
        *,
        loss: Any = None,
        optimizer: Any = None,
        scaler: Any = None,
        model: Any = None,
        memory: bool = False,
        **scalars: Any,
    ) -> None:
        """Loss, learning rate, loss scale, grad norm, NaN/Inf and memory for ``step``.

        Reading a device tensor synchronizes with the device; call this at your log interval.
        ``model`` computes the gradient norm (after backward, before zero_grad). ``memory``
        samples the device's and the process's memory at this step (the scalars of
        :mod:`fleetlens.sdk.memory`, which the SDK also samples every ``memory_s`` on its own).
        """
        try:
            out: dict[str, float] = {k: _item(v) for k, v in scalars.items()}
            if loss is not None:
                out["loss"] = _item(loss)
            if optimizer is not None:
                out["lr"] = float(optimizer.param_groups[0]["lr"])
            if scaler is not None and scaler.is_enabled():
                out["loss_scale"] = float(scaler.get_scale())
            if model is not None:
                grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
                if grads:
                    norm = torch.linalg.vector_norm(
                        torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])
                    )
                    out["grad_norm"] = _item(norm)
            if memory:
                out.update(self._memory.sample())
            bad = [k for k, v in out.items() if not math.isfinite(v)]
            self.run.log(step, **out)
            if bad:
                self.run.event(
                    "nan", step=step, message=f"non-finite {', '.join(bad)}", metrics=bad
                )
        except Exception:
            self.errors += 1
