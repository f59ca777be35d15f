"""A tiny GPT with tensor parallelism inside each host and data parallelism across hosts, which
MonkeyTree can move between hosts while it runs.

Plain (no MonkeyTree; two hosts' worth of processes on one machine):
    torchrun --standalone --nproc-per-node 4 examples/tp/train.py --tp 2 --steps 20 --out /tmp/run.json
Managed, on each of two hosts:
    monkeytree launch --job J --host H --dp 2 --tp 2 -- torchrun --nproc-per-node 2 examples/tp/train.py --tp 2 ...

The ranks form a (dp, tp) mesh: rank r is tensor-parallel rank r % tp of data-parallel replica
r // tp, so a host's processes (consecutive ranks under the launcher) make up one replica. The
attention projections and the MLP are split column-wise then row-wise across the tp ranks, which
save only their own slices when their host moves; the replicas average gradients by all-reduce.
"""
import argparse
import sys
from pathlib import Path

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import Start, Worker, batch, config, main, parser, train_step


def build(args: argparse.Namespace, start: Start) -> Worker:
    shape, world = config(args), dist.get_world_size()
    if world % args.tp or shape.heads % args.tp:
        raise ValueError(f"--tp {args.tp} must divide the world size ({world}) and the heads ({shape.heads})")
    mesh = init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    part = f"tensor-parallel slice {mesh.get_local_rank('tp')} of {args.tp}"
    module = start.model(shape, args.seed, empty="meta")
    for block in module.blocks.values():
        parallelize_module(block, mesh["tp"], {
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()})
    # The slices are DTensors on the old group's mesh: a re-formed group's processes place the
    # same local tensors on the new mesh instead of allocating and copying them.
    optimizer = start.materialise(module, part)
    replica, dp_group = mesh.get_local_rank("dp"), mesh.get_group("dp")
    return Worker(module, optimizer, part,
                  lambda step: train_step(module, optimizer, batch(shape, args.seed, step, replica), dp_group))


if __name__ == "__main__":
    arguments = parser(__doc__)
    arguments.add_argument("--tp", type=int, default=2, help="tensor-parallel degree: processes per replica")
    main(build, arguments)
