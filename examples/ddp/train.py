"""A data-parallel training script that MonkeyTree can move between hosts while it runs.

Plain (no MonkeyTree):
    torchrun --standalone --nproc-per-node 2 examples/ddp/train.py --steps 20 --out /tmp/run.json
Managed:
    monkeytree launch --job J --host H --dp N -- torchrun --nproc-per-node 1 examples/ddp/train.py ...

Everything a step computes follows from (--seed, step, rank): the model from the seed, each rank's
batch from its own generator, dropout from the RNG state the checkpoint carries. So a run that was
migrated, or whose group was re-formed, ends with the same parameters, bit for bit, as one that was
not; rank 0 writes the final step and a SHA-256 of the parameters to --out to show it.

CPU and gloo only; needs the hook installed (pip install sdk/python).
"""
import argparse
import hashlib
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import monkeytree

INPUTS, OUTPUTS, BATCH = 16, 4, 8


def build(seed, hidden):
    torch.manual_seed(seed)  # identical initial parameters on every rank
    model = torch.nn.Sequential(torch.nn.Linear(INPUTS, hidden), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(hidden, OUTPUTS))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def batch(seed, step, rank):
    """This rank's shard of step ``step``: a function of (seed, step, rank) alone."""
    generator = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_009 + rank)
    x = torch.randn(BATCH, INPUTS, generator=generator)
    return x, torch.sin(x[:, :OUTPUTS]) + 0.5 * x[:, OUTPUTS:2 * OUTPUTS]


def state_of(model, optimizer, step):
    """What a replacement needs to carry on exactly where this process stopped."""
    return {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": step,
            "rng": monkeytree.rng_state()}


def digest(model):
    sha = hashlib.sha256()
    for name, parameter in sorted(model.named_parameters()):
        sha.update(name.encode())
        sha.update(parameter.detach().contiguous().numpy().tobytes())
    return sha.hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=32,
                        help="hidden width; the model has about 21 × hidden parameters (5,000,000 → 105M)")
    parser.add_argument("--out", help="JSON file rank 0 writes at the end: final step and parameter digest")
    args = parser.parse_args()

    # Built before attaching: a replacement starts while the checkpoint is still on its way, and
    # attach() returns only once its move has committed, so the model is ready by then.
    model, optimizer = build(args.seed, args.hidden)
    job = monkeytree.attach()  # forms the process group (the launcher's, or torchrun's without one)
    step = 0
    if job.resuming:
        # A replacement: fill fresh objects with what the migrated process saved.
        monkeytree.init_optimizer_state(optimizer)  # SGD has no momentum buffers before its first step
        state = job.load(state_of(model, optimizer, 0))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        monkeytree.set_rng_state(state["rng"])
        step = state["step"]

    ddp = DistributedDataParallel(model)
    while step < args.steps:
        x, y = batch(args.seed, step, job.rank)
        optimizer.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        optimizer.step()
        step += 1
        directive = job.barrier(step, lambda: state_of(model, optimizer, step))
        if directive == "stop":
            return  # moved to another host (the replacement carries on) or the job ended
        if directive == "reconfigured":
            ddp = DistributedDataParallel(model)  # the old wrapper holds the destroyed group

    if job.rank == 0 and args.out:
        # Written aside and renamed: whoever waits for the file never reads half of it.
        with open(args.out + ".tmp", "w") as out:
            json.dump({"step": step, "worldSize": job.world_size, "generation": job.generation,
                       "digest": digest(model)}, out)
        os.replace(args.out + ".tmp", args.out)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
