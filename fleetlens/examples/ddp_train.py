"""A small transformer language model trained with DDP (gloo, CPU), instrumented with fleetlens.

    torchrun --standalone --nproc-per-node 4 examples/ddp_train.py --steps 40 \
        --slow-rank 2 --slow-ms 40 --from-step 10

Every rank reads torchrun's environment (RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID) through
``fleetlens.init`` and reports to ``$FLEETLENS_SERVER``. ``--slow-rank R --slow-ms X --from-step
S`` makes rank R spend X ms more in its forward pass from step S on, as a slow GPU would.
``--instrument alternate`` switches fleetlens on and off every ``--block`` steps, the same on
every rank, so bench/torch_overhead.py can compare step times in one run. ``--stats-dir`` writes
each rank's SDK counters and step times as JSON.

Draining (docs/remediation.md): every step boundary asks ``tr.stop_requested``; on a drain, rank
0 writes a verified checkpoint to ``--checkpoint-dir`` and the workers exit for torchrun to
re-form the job; a restarted worker resumes from the newest verified checkpoint there. Run it
under elastic torchrun (``--nnodes=2:3 --max-restarts 3 --rdzv-backend c10d``) for that.
``--slow-node N`` / ``--hang-node N --hang-at-step S`` fault the rank on node ``N``
(``FLEETLENS_NODE_ID``) the way a slow or hung GPU would; ``--hang-rank R --hang-at-step S``
hangs rank ``R`` before step ``S`` (the others wait for it in that step's all-reduce).
``--lost-gpu-dir D``: a worker started on a node named by a file in ``D`` finds its GPU gone (the
cordon drill's fatal fault): it joins the process group, so its peers fail fast rather than wait
for it, and waits for the server to take its node out (``TorchRun.await_removal``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import fleetlens
import fleetlens.torch as fltorch


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, seq, dim))
        block = nn.TransformerEncoderLayer(dim, heads, dim * 4, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(block, layers)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        n = tokens.shape[1]
        mask: torch.Tensor = self.mask  # type: ignore[assignment]
        x = self.blocks(x, mask=mask[:n, :n], is_causal=True)
        return self.head(x)  # type: ignore[no-any-return]


def batches(rank: int, vocab: int, seq: int, batch: int, offset: int = 0):  # type: ignore[no-untyped-def]
    """Sequences with a learnable rule (each token is the previous plus a per-sequence stride)."""
    g = torch.Generator().manual_seed(1234 + rank + 1_000_003 * offset)
    while True:
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        stride = torch.randint(1, 4, (batch, 1), generator=g)
        yield (start + stride * torch.arange(seq + 1)) % vocab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-ms", type=float, default=0.0)
    ap.add_argument("--from-step", type=int, default=0)
    ap.add_argument("--instrument", choices=("on", "off", "alternate"), default="on")
    ap.add_argument("--block", type=int, default=10, help="steps per block when alternating")
    ap.add_argument("--stats-dir", default="")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--checkpoint-every", type=int, default=0)
    ap.add_argument("--checkpoint-dir", default="", help="default: --stats-dir or .")
    ap.add_argument("--slow-node", default="", help="the rank(s) on this node are slow")
    ap.add_argument("--hang-node", default="", help="the rank(s) on this node hang ...")
    ap.add_argument("--hang-rank", type=int, default=-1, help="this rank hangs ...")
    ap.add_argument("--hang-at-step", type=int, default=-1, help="... at this step")
    ap.add_argument("--min-nodes", type=int, default=1, help="the launcher's minimum nodes")
    ap.add_argument("--lost-gpu-dir", default="", help="a file named after this node: no GPU")
    args = ap.parse_args()
    ckpt_dir = args.checkpoint_dir or args.stats_dir or "."
    node = os.environ.get("FLEETLENS_NODE_ID", "")

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    vocab = 128
    torch.manual_seed(0)
    config = {
        "model": "tiny-lm",
        "dim": args.dim,
        "layers": args.layers,
        "seq": args.seq,
        "batch": args.batch,
        "world_size": world,
        "lr": 3e-3,
        "total_steps": args.steps,
        "min_nodes": args.min_nodes,
    }
    run = fleetlens.init(project="ddp-example", config=config, enabled=args.instrument != "off")
    tr = fltorch.TorchRun(run)
    if args.lost_gpu_dir and node and os.path.exists(os.path.join(args.lost_gpu_dir, node)):
        tr.await_removal(120.0)
        raise RuntimeError(f"no GPU on {node}: it fell off the bus (Xid 79)")
    # The only buffer is a constant causal mask: no need for DDP to broadcast it every forward
    # (which would also make every rank's forward wait for the slowest).
    model = DDP(TinyLM(vocab, args.dim, args.layers, 4, args.seq), broadcast_buffers=False)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    if args.instrument != "off":
        tr.watch_ddp(model)
    loss_fn = nn.CrossEntropyLoss()
    start = 0
    resumed = tr.resume(ckpt_dir) if args.checkpoint_dir else None
    if resumed is not None:
        start, saved = resumed
        model.module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optim"])
    data = batches(rank, vocab, args.seq, args.batch, start)
    step_times: list[tuple[int, bool, float]] = []
    slow = rank == args.slow_rank or (args.slow_node != "" and node == args.slow_node)

    def state() -> dict[str, object]:
        return {"model": model.module.state_dict(), "optim": opt.state_dict()}

    for step, tokens in enumerate(tr.loader(data), start):
        if step >= args.steps:
            break
        on = args.instrument == "on" or (
            args.instrument == "alternate" and (step // args.block) % 2 == 1
        )
        t0 = time.perf_counter()
        if on and tr.stop_requested(step):  # the same answer on every rank
            tr.drain(step, state, ckpt_dir)
        hang = (node and node == args.hang_node) or rank == args.hang_rank
        if hang and step == args.hang_at_step:
            while True:  # a hung GPU: this rank never reaches the next collective
                time.sleep(1.0)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        if on:
            with tr.step(step, tokens=inputs.numel()):
                with tr.phase("forward"):
                    if slow and step >= args.from_step:
                        time.sleep(args.slow_ms / 1000.0)
                    logits = model(inputs)
                    loss = loss_fn(logits.reshape(-1, vocab), targets.reshape(-1))
                with tr.phase("backward"):
                    loss.backward()
                with tr.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            if rank == 0:
                tr.log(step, loss=loss, optimizer=opt)
        else:
            if slow and step >= args.from_step:
                time.sleep(args.slow_ms / 1000.0)
            logits = model(inputs)
            loss = loss_fn(logits.reshape(-1, vocab), targets.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        step_times.append((step, on, time.perf_counter() - t0))
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and rank == 0:
            fltorch.save_verified(run, state(), ckpt_dir, step + 1)
        if not math.isfinite(loss.item()):
            break

    run.finish()
    if args.stats_dir:
        with open(os.path.join(args.stats_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(
                {
                    "rank": rank,
                    "stats": run.stats(),
                    "torch_errors": tr.errors,
                    "run_id": run.config.run_id,
                    "final_loss": loss.item(),
                    "step_times": step_times,
                },
                fh,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
