"""A pipeline-parallel language model (2 stages x 2 data-parallel replicas, PyTorch's
``torch.distributed.pipelining`` 1F1B schedule over a ``DeviceMesh``, gloo on CPU), profiled with
``torch.profiler`` so its per-rank Kineto traces can be imported:

    torchrun --standalone --nproc-per-node 4 examples/pipeline_train.py --profile traces/
    fleetlens traces import traces/ --run pp-demo --as-run

The last stage holds the output projection over a large vocabulary and the loss, so it does more
work than the first by design: the imbalance a partitioning choice makes, which fleetlens must
report as stage imbalance (owner: the training configuration), not as slow workers. The mesh's
dimensions (``pp``, ``dp``) are in each trace's ``distributedInfo.pg_config`` as the process
groups ``mesh_pp`` and ``mesh_dp``; the importer reads the layout from them.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B


def mlp(dim: int) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))


class Stage(nn.Module):
    """One pipeline stage: the embedding on the first, the vocabulary projection on the last,
    ``layers`` MLP blocks on each."""

    def __init__(self, first: bool, last: bool, vocab: int, dim: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim) if first else None
        self.blocks = nn.Sequential(*(mlp(dim) for _ in range(layers)))
        self.head = nn.Linear(dim, vocab) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        x = self.blocks(x)
        return self.head(x) if self.head is not None else x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--profile", default="", help="write each rank's Kineto trace here")
    ap.add_argument("--profile-steps", type=int, default=12, help="steps profiled, after 2")
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (args.pp, world // args.pp), mesh_dim_names=("pp", "dp"))
    stage_idx = mesh.get_local_rank("pp")
    dp_group = mesh.get_group("dp")
    first, last = stage_idx == 0, stage_idx == args.pp - 1
    torch.manual_seed(0)
    module = Stage(first, last, args.vocab, args.dim, args.layers)
    stage = PipelineStage(
        module, stage_idx, args.pp, torch.device("cpu"), group=mesh.get_group("pp")
    )
    loss = nn.CrossEntropyLoss()

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return loss(logits.reshape(-1, args.vocab), target.reshape(-1))  # type: ignore[no-any-return]

    schedule = Schedule1F1B(stage, args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1234 + mesh.get_local_rank("dp"))

    def export(p: torch.profiler.profile) -> None:
        plain = os.path.join(args.profile, f"rank-{rank}.json")
        p.export_chrome_trace(plain)
        with open(plain, "rb") as src, gzip.open(plain + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(plain)

    prof = None
    if args.profile:  # one cycle: 2 steps not kept, then --profile-steps recorded
        os.makedirs(args.profile, exist_ok=True)
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=args.profile_steps, repeat=1),
            on_trace_ready=export,
        )
        prof.start()
    for _ in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
        x, y = tokens[:, :-1], tokens[:, 1:]
        if first:
            schedule.step(x)
        elif last:
            schedule.step(target=y)
        else:
            schedule.step()
        for p in module.parameters():  # the data-parallel gradient average
            if p.grad is not None:
                dist.all_reduce(p.grad, group=dp_group)
                p.grad.div_(dist.get_world_size(dp_group))
        opt.step()
        opt.zero_grad(set_to_none=True)
        if prof is not None:
            prof.step()
    if prof is not None:
        prof.stop()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
