"""A Hugging Face ``Trainer`` on a tiny random GPT-2 (built here, nothing downloaded) and random
tokens, reporting through fleetlens's callback as a user would write it. DDP over gloo on CPU:

    torchrun --nproc-per-node 4 hf_trainer.py --max-steps 60 --out DIR
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import fleetlens
import fleetlens.callbacks


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seq_len: int, vocab: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--out", default="out-hf")
    args = ap.parse_args()

    config = GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=args.vocab, n_positions=args.seq_len
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    data = RandomTokens(args.max_steps * args.batch_size * world, args.seq_len, args.vocab)
    training = TrainingArguments(
        output_dir=args.out,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        disable_tqdm=True,
        include_num_input_tokens_seen=True,  # fleetlens: tokens per step
    )
    run = fleetlens.init(project="hf-trainer", config={**vars(args), **config.to_dict()})
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=data,
        callbacks=[fleetlens.callbacks.huggingface(run)],
    )
    trainer.train()
    run.finish()


if __name__ == "__main__":
    main()
