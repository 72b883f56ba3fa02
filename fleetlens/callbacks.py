"""Callbacks for the trainers people already use: Hugging Face ``Trainer`` and PyTorch
Lightning. Both report through a fleetlens run with the same guarantees as the SDK (nothing
raised into training, nothing blocking it); the frameworks are imported only when asked for.

    run = fleetlens.init(project="llm")
    trainer = transformers.Trainer(..., callbacks=[fleetlens.callbacks.huggingface(run)])
    trainer = lightning.Trainer(..., callbacks=[fleetlens.callbacks.lightning(run)])

Both time steps (with ``fleetlens.init`` in a DDP job, each rank's wait for the others is taken
out of them: :mod:`fleetlens.torch.auto`) and count tokens: Lightning's from the batch
(``input_ids``, or the batch tensor), Hugging Face's from ``state.num_input_tokens_seen``
(``TrainingArguments(include_num_input_tokens_seen=True)``).
"""

from __future__ import annotations

import contextlib
import numbers
from typing import Any

from .sdk.run import Run

__all__ = ["huggingface", "lightning"]


def _numbers(logs: dict[str, Any] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in (logs or {}).items():
        if hasattr(v, "item"):
            with contextlib.suppress(Exception):
                v = v.item()
        if isinstance(v, numbers.Real) and not isinstance(v, bool):
            out[str(k).replace("/", ".")] = float(v)
    return out


class _Steps:
    """The open step span between a framework's step-begin and step-end hooks."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.span: Any = None

    def begin(self, step: int, tokens: int = 0) -> None:
        self.end()
        self.span = self.run.step(step, tokens=tokens)
        self.span.__enter__()

    def end(self, tokens: int | None = None) -> None:
        span, self.span = self.span, None
        if span is not None:
            if tokens:
                span.tokens = tokens
            span.__exit__(None, None, None)


def _tokens(batch: Any) -> int:
    """Tokens in a batch: the elements of its token ids (a dict's ``input_ids``, the first
    tensor of a tuple, or the batch itself) when they are integers; else 0."""
    try:
        if isinstance(batch, dict):
            batch = batch.get("input_ids", next(iter(batch.values()), None))
        elif isinstance(batch, (list, tuple)) and batch:
            batch = batch[0]
        dtype = getattr(batch, "dtype", None)
        if dtype is None or getattr(dtype, "is_floating_point", True):
            return 0
        return int(batch.numel())
    except Exception:
        return 0


def huggingface(run: Run) -> Any:
    """A ``transformers.TrainerCallback``: steps, logged scalars, checkpoints."""
    from transformers import TrainerCallback

    class FleetlensCallback(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.steps = _Steps(run)
            self.seen = 0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.steps.begin(int(state.global_step))

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            # Tokens are counted by the Trainer when include_num_input_tokens_seen is on.
            seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
            self.steps.end(seen - self.seen if seen > self.seen else None)
            self.seen = max(self.seen, seen)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            values = _numbers(logs)
            if "learning_rate" in values:
                values["lr"] = values.pop("learning_rate")
            if values:
                run.log(int(state.global_step), **values)

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            run.checkpoint(int(state.global_step), path=str(args.output_dir), sync=True)

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.steps.end()
            run.flush(5.0)

    return FleetlensCallback()


def lightning(run: Run) -> Any:
    """A ``lightning.pytorch.Callback``: steps, the step's loss, checkpoints."""
    from lightning.pytorch.callbacks import Callback

    class FleetlensCallback(Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.steps = _Steps(run)

        def on_train_batch_start(
            self, trainer: Any, module: Any, batch: Any, batch_idx: int
        ) -> None:
            self.steps.begin(int(trainer.global_step), _tokens(batch))

        def on_train_batch_end(
            self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            step = int(trainer.global_step) - 1  # Lightning counts the step just taken
            self.steps.end()
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            values = _numbers({"loss": loss, **dict(trainer.callback_metrics)})
            if values:
                run.log(max(step, 0), **values)

        def on_save_checkpoint(self, trainer: Any, module: Any, checkpoint: Any) -> None:
            run.checkpoint(int(trainer.global_step), path=str(trainer.default_root_dir), sync=True)

        def on_train_end(self, trainer: Any, module: Any) -> None:
            self.steps.end()
            run.flush(5.0)

    return FleetlensCallback()
