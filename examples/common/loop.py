"""The managed training loop every example shares, and its command line."""
import argparse
import gc
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

import monkeytree

from .gpt import GPT, Config, lm_loss
from .state import adopt_optimizer_state, adopted, average_gradients, digest, fill, local_state, saved_state


@dataclass
class State:
    """This process's share of the job's training state."""

    module: nn.Module  # the parameters this process holds, named as in the whole GPT
    optimizer: torch.optim.Optimizer
    part: str  # which part of the job's state they are; a replacement or a re-formed group must hold the same


@dataclass
class Worker(State):
    """This process's share of the job, built on the current process group."""

    train_step: Callable[[int], None]  # one optimizer step on the batch of the given step


@dataclass(frozen=True)
class Start:
    """What a build starts from: where this process's state will come from."""

    # False when the state is about to be overwritten, by a replacement's load or by what a re-formed
    # group's processes carry over: initialising a model of 1 GiB would cost the job seconds for nothing.
    initialise: bool = True
    # The worker on the group this process just left, or what a replacement built before it attached.
    previous: State | None = None

    def model(self, shape: Config, seed: int, empty: str = "cpu") -> GPT:
        """The whole GPT, its parameters seeded; when not ``initialise``, left unset on device ``empty``:
        in fresh memory, or with none on ``"meta"`` until ``to_empty``, so that a wrapper that shards
        them allocates only this process's shards."""
        if self.initialise:
            return GPT(shape, seed)
        with torch.device("meta"):
            module = GPT(shape, seed)
        return module if empty == "meta" else module.to_empty(device=empty)

    def kept(self, part: str) -> State | None:
        """The previous state, when it is ``part`` again: its module and optimizer, which hold no
        process group unless sharded, can train on in the new group without a copy of their state."""
        return self.previous if self.previous is not None and self.previous.part == part else None


class Job(Protocol):
    """What ``monkeytree.attach()`` returns, as far as the loop uses it."""

    rank: int
    world_size: int
    generation: int
    resuming: bool

    def load(self, template: dict) -> dict: ...

    def barrier(self, step: int, state_fn: Callable[[], dict]) -> str: ...


Build = Callable[[argparse.Namespace, Start], Worker]
# What an example can build without a process group, so a replacement builds it before it attaches.
Prepare = Callable[[argparse.Namespace], State]


def parser(description: str) -> argparse.ArgumentParser:
    """The options every example takes; an example adds its own parallelism's."""
    options = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_argument("--steps", type=int, default=20)
    options.add_argument("--seed", type=int, default=0)
    options.add_argument("--width", type=int, default=Config.width, help="model width (two attention heads)")
    options.add_argument("--layers", type=int, default=Config.layers, help="transformer blocks")
    options.add_argument("--rows", type=int, default=Config.rows, help="sequences per data-parallel replica per step")
    options.add_argument("--out", help="JSON file rank 0 writes at the end: step, worldSize, generation and the"
                                       " SHA-256 of all parameters and optimizer state")
    return options


def config(args: argparse.Namespace) -> Config:
    return Config(width=args.width, layers=args.layers, rows=args.rows)


def adamw(module: nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW(module.parameters(), lr=3e-3, weight_decay=0.1)


def update(optimizer: torch.optim.Optimizer, dp_group: dist.ProcessGroup | None = None) -> None:
    """Steps ``optimizer``, first averaging its gradients over ``dp_group`` when one is given."""
    if dp_group is not None:
        average_gradients((p for group in optimizer.param_groups for p in group["params"]), dp_group)
    optimizer.step()
    optimizer.zero_grad()


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, torch.Tensor],
               dp_group: dist.ProcessGroup | None = None) -> None:
    inputs, targets = batch
    lm_loss(model(inputs), targets).backward()
    update(optimizer, dp_group)


def _state(worker: Worker, step: int) -> dict:
    return {**saved_state(worker.module, worker.optimizer), "part": worker.part.encode(), "step": step}


def _check_part(held: str, worker: Worker) -> None:
    if held != worker.part:
        raise RuntimeError(f"this process now holds {worker.part} of the job but its state is {held};"
                           " the example re-forms only onto the same layout")


def _resume(job: Job, worker: Worker) -> int:
    # Adam's moments exist only after a first step; load fills them in place.
    monkeytree.init_optimizer_state(worker.optimizer)
    state = job.load(_state(worker, 0))
    _check_part(state["part"].decode(), worker)
    return state["step"]


def _carry_over(old: Worker, new: Worker) -> Worker:
    _check_part(old.part, new)
    if new.module is old.module and new.optimizer is old.optimizer:
        return new
    if adopted(new.module, old.module):
        adopt_optimizer_state(new.module, new.optimizer, old.module, old.optimizer)
        return new
    # The old objects hold the destroyed group, but their local tensors are still this process's state.
    monkeytree.init_optimizer_state(new.optimizer)
    fill(local_state(new.module, new.optimizer), local_state(old.module, old.optimizer))
    return new


def _train(job: Job, args: argparse.Namespace, build: Build, held: State | None) -> tuple[Worker, int] | None:
    """Trains from where ``job`` stands to ``args.steps``, meeting the launcher after every step;
    None when this process was told to stop (moved to another host: the replacement carries on)."""
    worker = build(args, Start(initialise=not job.resuming, previous=held))
    step = _resume(job, worker) if job.resuming else 0
    while step < args.steps:
        worker.train_step(step)
        step += 1
        directive = job.barrier(step, partial(_state, worker, step))
        if directive == "stop":
            return None
        if directive == "reconfigured":
            worker = _carry_over(worker, build(args, Start(initialise=False, previous=worker)))
    return worker, step


def run(job: Job, args: argparse.Namespace, build: Build, held: State | None = None) -> None:
    """Trains, writes ``--out`` on rank 0 once training ended, and leaves the process group."""
    trained = _train(job, args, build, held)
    if trained is not None:
        worker, step = trained
        result = digest(worker.module, worker.optimizer)  # every rank takes part
        if job.rank == 0 and args.out:
            # Written aside and renamed: whoever waits for the file never reads half of it.
            with open(args.out + ".tmp", "w") as out:
                json.dump({"step": step, "worldSize": job.world_size, "generation": job.generation,
                           "digest": result}, out)
            os.replace(args.out + ".tmp", args.out)
        del worker
    # Released before the group: a DDP reducer left holding it would destroy it with the GIL held,
    # and deadlock against the gloo thread that still frees the gather's Python tensors. FSDP's
    # modules and hooks refer to each other, so only the collector frees them; left to the
    # interpreter's exit, the group dies there with its threads running, and the process aborts.
    # A stopped process's group is already gone (the hook holds it until exit), but not its modules.
    del trained
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


def _prepared(prepare: Prepare, args: argparse.Namespace) -> State:
    held = prepare(args)
    # Adam's moments too: all of it in memory already touched, which the load only overwrites.
    monkeytree.init_optimizer_state(held.optimizer)
    return held


def main(build: Build, options: argparse.ArgumentParser, prepare: Prepare | None = None) -> None:
    args = options.parse_args()
    # A replacement's attach returns once its move commits, with the job stopped: what needs no
    # process group it builds first, while the job still trains.
    held = _prepared(prepare, args) if prepare is not None and monkeytree.resuming() else None
    run(monkeytree.attach(), args, build, held)
