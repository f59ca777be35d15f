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
from .state import adopt, average_gradients, digest, saved_state, touch


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
    # A step's work that needs no answer from a peer, for a replacement to run ahead of its move on
    # the placeholder group; None: ``train_step`` itself, whose collectives that group answers.
    rehearse: Callable[[], None] | None = None


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
        process group unless sharded, can train on in the new group without a copy of their state.

        A build must then train on that state's memory (keep its objects, or ``materialise``):
        the loop carries nothing over itself."""
        return self.previous if self.previous is not None and self.previous.part == part else None

    def materialise(self, module: nn.Module, part: str) -> torch.optim.Optimizer:
        """Gives ``module``, a ``model(empty="meta")`` sharded or sliced on the new group, its
        memory: the kept state's when it is ``part`` again (adopted, not copied), else fresh.
        Returns its optimizer, holding the kept state's moments where there are any."""
        kept = self.kept(part)
        if kept is not None:
            return adopt(module, kept.module, kept.optimizer, adamw)
        if not self.initialise:
            module.to_empty(device="cpu")
        return adamw(module)


class Job(Protocol):
    """What ``monkeytree.attach()`` returns, as far as the loop uses it."""

    rank: int
    world_size: int
    generation: int
    resuming: bool

    def load(self, template: dict) -> dict: ...

    def barrier(self, step: int, state_fn: Callable[[], dict]) -> str: ...


Build = Callable[[argparse.Namespace, Start], Worker]


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
            # Only the new worker may outlive the build: the old one's wrappers hold the destroyed
            # group, whose last reference must go before the hook's does at the next barrier.
            part = worker.part
            worker = build(args, Start(initialise=False, previous=worker))
            # The build trains on the previous state's memory only when it holds the same part.
            _check_part(part, worker)
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


def _built_ahead(build: Build, args: argparse.Namespace) -> State | None:
    """A replacement's state for the place it expects, built on a placeholder group before it
    attaches: a replacement's attach returns once its move commits, with the job stopped, and
    its state then costs the job only a load into memory already touched."""
    place = monkeytree.expected_place()
    if place is None:
        return None
    with monkeytree.placeholder_group(place):
        worker = build(args, Start(initialise=False))
        # Adam's moments too, and every page written once: the load then only overwrites, where
        # a first touch of fresh memory would cost it about as much again.
        monkeytree.init_optimizer_state(worker.optimizer)
        touch(worker.module)
        # A step on zeros, whose results the load overwrites: a fresh process's first step grows
        # its heap and fills the libraries' caches, which cost the job up to half a step more
        # after the move than a step of a process that has trained (0.5 s at 1 GiB).
        (worker.rehearse or partial(worker.train_step, 0))()
    # Without its training step, which holds the placeholder group's wrappers.
    return State(worker.module, worker.optimizer, worker.part)


def main(build: Build, options: argparse.ArgumentParser) -> None:
    args = options.parse_args()
    held = _built_ahead(build, args)  # before attach, which a replacement's launcher answers at commit
    run(monkeytree.attach(), args, build, held)
