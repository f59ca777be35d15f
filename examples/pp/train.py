"""A tiny GPT split into pipeline stages, each stage data-parallel across hosts, which MonkeyTree
can move between hosts while it runs.

Plain (no MonkeyTree; four hosts' worth of processes on one machine):
    torchrun --standalone --nproc-per-node 4 examples/pp/train.py --pp 2 --steps 20 --out /tmp/run.json
Managed, one process per host, on each host H of stage G (G = 0, 1; two hosts per stage):
    monkeytree launch --job J --host H --group G --pp 2 --dp 2 \\
        -- torchrun --nproc-per-node 1 examples/pp/train.py --pp 2 ...

The ranks form a (pp, dp) mesh: rank r runs stage r // dp of data-parallel replica r % dp, which
is the launcher's node rank (stage × dp + place in the stage's group). A stage holds only its own
blocks (the first also the embeddings, the last the final norm and head), saves only those and
their optimizer state when its host moves, and averages their gradients over its stage's replicas.
"""
import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import GPT, Start, Worker, adamw, batch, config, lm_loss, main, parser, update

MICROBATCHES = 4


def stage_of(model: GPT, stage: int, stages: int) -> GPT:
    """Drops what other stages own from ``model``; the rest keeps its names."""
    per_stage = len(model.blocks) // stages
    for name in list(model.blocks):
        if int(name) // per_stage != stage:
            del model.blocks[name]
    if stage != 0:
        model.embed = model.position = None
    if stage != stages - 1:
        model.norm = model.head = None
    return model


def build(args: argparse.Namespace, start: Start) -> Worker:
    shape, world = config(args), dist.get_world_size()
    if world % args.pp or shape.layers % args.pp:
        raise ValueError(f"--pp {args.pp} must divide the world size ({world}) and --layers ({shape.layers})")
    if shape.rows % MICROBATCHES:
        raise ValueError(f"--rows {shape.rows} must be a multiple of the schedule's {MICROBATCHES} microbatches")
    mesh = init_device_mesh("cpu", (args.pp, world // args.pp), mesh_dim_names=("pp", "dp"))
    stage, replica = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    part = f"stage {stage} of {args.pp}"
    # Only the pipeline's stage and schedule hold a process group; the stage's module does not.
    kept = start.kept(part)
    module = kept.module if kept else stage_of(start.model(shape, args.seed), stage, args.pp)
    pipe = PipelineStage(module, stage, args.pp, torch.device("cpu"), group=mesh.get_group("pp"))
    schedule = ScheduleGPipe(pipe, MICROBATCHES, loss_fn=lm_loss)
    optimizer = kept.optimizer if kept else adamw(module)
    dp_group = mesh.get_group("dp")

    def train_step(step: int) -> None:
        inputs, targets = batch(shape, args.seed, step, replica)
        schedule.step(*([inputs] if stage == 0 else []), target=targets if stage == args.pp - 1 else None)
        update(optimizer, dp_group)

    return Worker(module, optimizer, part, train_step)


if __name__ == "__main__":
    arguments = parser(__doc__)
    arguments.add_argument("--pp", type=int, default=2, help="pipeline stages; the data-parallel degree is world / pp")
    main(build, arguments)
