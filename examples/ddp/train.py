"""A tiny GPT trained with DistributedDataParallel, which MonkeyTree can move between hosts while it runs.

Plain (no MonkeyTree):
    torchrun --standalone --nproc-per-node 2 examples/ddp/train.py --steps 20 --out /tmp/run.json
Managed, on each host:
    monkeytree launch --job J --host H --dp N -- torchrun --nproc-per-node 2 examples/ddp/train.py ...

Every rank holds the whole model and optimizer state; rank r trains on data-parallel replica r's
batches. Rank 0 writes the final step and a SHA-256 of all parameters and optimizer state to
--out, the same bit for bit whether or not the run was migrated or its group re-formed.
"""
import argparse
import sys
from pathlib import Path

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import Start, Worker, adamw, batch, config, main, parser, train_step

PART = "a replica of the whole model"


def build(args: argparse.Namespace, start: Start) -> Worker:
    shape = config(args)
    # Only the wrapper holds the process group: a re-formed group's processes wrap the same module.
    kept = start.kept(PART)
    module = kept.module if kept else start.model(shape, args.seed)
    # There are no unused parameters, but looking for them keeps DDP's gradient buckets as first laid
    # out; otherwise DDP lays them out anew after its first iteration, so the wrapper rebuilt after a
    # re-formed group would sum that iteration's gradients in another order (over two ranks, other bits).
    # Every rank builds the same seeded model, and a replacement loads what the others hold: there
    # is nothing to broadcast, which at a re-formation would hold the whole job for the model's bytes.
    model = DistributedDataParallel(module, find_unused_parameters=True, init_sync=False)
    optimizer = kept.optimizer if kept else adamw(module)
    replica = dist.get_rank()
    # DDP's gradient hooks cannot run on a placeholder group: a replacement rehearses unwrapped.
    return Worker(module, optimizer, PART,
                  lambda step: train_step(model, optimizer, batch(shape, args.seed, step, replica)),
                  lambda: train_step(module, optimizer, batch(shape, args.seed, 0, replica)))


if __name__ == "__main__":
    main(build, parser(__doc__))
