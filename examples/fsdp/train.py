"""A tiny GPT fully sharded with FSDP2 over every rank, which MonkeyTree can move between hosts while it runs.

Plain (no MonkeyTree):
    torchrun --standalone --nproc-per-node 4 examples/fsdp/train.py --steps 20 --out /tmp/run.json
Managed, on each of two hosts:
    monkeytree launch --job J --host H --dp 2 -- torchrun --nproc-per-node 2 examples/fsdp/train.py ...

Each rank holds one shard of every parameter and of its Adam moments, and that shard is all it
saves when its host moves: nothing is gathered. Rank r trains on data-parallel replica r's batches.
"""
import argparse
import sys
import warnings
from pathlib import Path

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import Start, Worker, batch, config, main, parser, train_step

# The logits are a view; FSDP2 warns that an in-place op on them would skip its backward hook, and
# the loss reads them out of place.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")


def build(args: argparse.Namespace, start: Start) -> Worker:
    shape = config(args)
    # The parameters are DTensors on the mesh of the group they were built on: a re-formed group's
    # processes shard a new module on meta and give it the old one's shards.
    module = start.model(shape, args.seed, empty="meta")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in module.blocks.values():
        fully_shard(block, mesh=mesh)
    fully_shard(module, mesh=mesh)
    rank = dist.get_rank()
    part = f"shard {rank} of {mesh.size()}"
    optimizer = start.materialise(module, part)
    return Worker(module, optimizer, part,
                  lambda step: train_step(module, optimizer, batch(shape, args.seed, step, rank)))


if __name__ == "__main__":
    main(build, parser(__doc__))
