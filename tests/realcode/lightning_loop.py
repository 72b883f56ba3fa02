"""A Lightning loop on a tiny random GPT-2 (built here, nothing downloaded) and random tokens,
reporting through fleetlens's callback as a user would write it. Under torchrun Lightning takes
the ranks from the environment; DDP over gloo on CPU:

    torchrun --nproc-per-node 4 lightning_loop.py --max-steps 60 --out DIR
"""

from __future__ import annotations

import argparse
import os

import lightning as L
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import fleetlens
import fleetlens.callbacks


class TinyGPT(L.LightningModule):
    def __init__(self, vocab: int, seq_len: int, lr: float) -> None:
        super().__init__()
        config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=vocab, n_positions=seq_len)
        self.model = GPT2LMHeadModel(config)
        self.lr = lr

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.model(input_ids=batch, labels=batch).loss
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--out", default="out-lightning")
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, args.vocab, (args.max_steps * args.batch_size * world, args.seq_len),
                           generator=g)  # fmt: skip
    loader = torch.utils.data.DataLoader(tokens, batch_size=args.batch_size, shuffle=True)

    torch.manual_seed(0)
    module = TinyGPT(args.vocab, args.seq_len, args.lr)
    run = fleetlens.init(project="lightning", config=vars(args))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp",
        max_steps=args.max_steps,
        default_root_dir=args.out,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[fleetlens.callbacks.lightning(run)],
    )
    trainer.fit(module, loader)
    run.finish()


if __name__ == "__main__":
    main()
