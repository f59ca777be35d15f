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
from common import GPT, Config, Start, Worker, adamw, batch, config, lm_loss, main, parser, update

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


def microbatch(shape: Config, stage: int, stages: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``stage`` takes in and gives out per microbatch, as tensors on the meta device: token
    ids into the first stage, logits out of the last, activations in between."""
    rows = shape.rows // MICROBATCHES
    with torch.device("meta"):
        tokens = torch.empty(rows, shape.context, dtype=torch.long)
        hidden = torch.empty(rows, shape.context, shape.width, requires_grad=True)  # a gradient flows back
        logits = torch.empty(rows, shape.context, shape.vocab)
    return tokens if stage == 0 else hidden, logits if stage == stages - 1 else hidden


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
    # Given each microbatch's shapes, the schedule's first step need not ask the other stages for
    # them, which every re-formed group's first step would otherwise do again.
    taken, given = microbatch(shape, stage, args.pp)
    pipe = PipelineStage(module, stage, args.pp, torch.device("cpu"), input_args=taken, output_args=given,
                         group=mesh.get_group("pp"))
    schedule = ScheduleGPipe(pipe, MICROBATCHES, loss_fn=lm_loss)
    optimizer = kept.optimizer if kept else adamw(module)
    dp_group = mesh.get_group("dp")

    def train_step(step: int) -> None:
        inputs, targets = batch(shape, args.seed, step, replica)
        schedule.step(*([inputs] if stage == 0 else []), target=targets if stage == args.pp - 1 else None)
        update(optimizer, dp_group)

    def rehearse() -> None:
        # The schedule's first step waits on the other stages even on a placeholder group: the
        # stage's own work instead, its microbatches on zeros, held at once as GPipe holds them.
        inputs = torch.zeros_like(taken, device="cpu").requires_grad_(taken.is_floating_point())
        sum(module(inputs).sum() for _ in range(MICROBATCHES)).backward()
        update(optimizer)

    return Worker(module, optimizer, part, train_step, rehearse)


if __name__ == "__main__":
    arguments = parser(__doc__)
    arguments.add_argument("--pp", type=int, default=2, help="pipeline stages; the data-parallel degree is world / pp")
    main(build, arguments)
