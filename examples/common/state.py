"""A process's own part of the job's training state: what it saves when it moves, what it carries
into new objects when its process group is re-formed, and the job-wide digest of it all."""
import hashlib
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def _local(tensor: torch.Tensor) -> torch.Tensor:
    # A DTensor's local shard or slice, which shares storage with it: filling it fills the
    # parameter or moment in place, and reading it needs no process group, not even a live one.
    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach()


def saved_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """This process's parameters and optimizer state, keyed by parameter name, as it saves them
    when it moves: sharded and sliced tensors stay DTensors, so the checkpoint records where each
    local piece lies in the whole tensor, and ``monkeytree checkpoint export`` can put the pieces
    of several processes together.

    Taken from the parameters and ``optimizer.state`` directly, the same way under every wrapper.
    Taking or filling this state must not communicate: the moving host's processes save while the
    rest of the job waits outside torch, and a replacement loads while its peers carry their own
    state over. ``torch.distributed.checkpoint.state_dict``'s getters and setters did not
    communicate for FSDP2 in torch 2.13 (rank 0 alone took and set them while the others slept),
    but nothing promises that they never will; a DTensor's local piece and its placement cannot.
    """
    named = dict(module.named_parameters())
    return {"model": {name: p.detach() for name, p in named.items()},
            "optim": {name: {key: value.detach() for key, value in optimizer.state[p].items()}
                      for name, p in named.items()}}


def _placed_as(tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``tensor``'s local piece, placed as ``like`` is: a DTensor on ``like``'s mesh over the same memory."""
    local = _local(tensor)
    if not isinstance(like, DTensor):
        return local
    return DTensor.from_local(local, like.device_mesh, like.placements, shape=like.shape, stride=like.stride())


def adopt(module: nn.Module, previous: nn.Module, previous_optimizer: torch.optim.Optimizer,
          optimizer_for: Callable[[nn.Module], torch.optim.Optimizer]) -> torch.optim.Optimizer:
    """Gives ``module``, built on the meta device for a new process group (sharded or sliced by
    it, or not), the memory of ``previous``'s namesake parameters; returns its optimizer, made by
    ``optimizer_for``, with their state. Sharded and sliced tensors stay DTensors, now on the new
    mesh, over the same local tensors: nothing is allocated or copied. ``previous`` may be built
    on a group since destroyed.

    Through ``nn.Module._apply``, as ``to_empty`` gives memory: FSDP2 then takes each new local
    shard as its own, where replacing the parameters by hand would leave its copies of them stale.
    It replaces plain parameters by new objects, so the optimizer is made after.
    """
    held = dict(previous.named_parameters())
    names = {id(p): name for name, p in module.named_parameters()}
    module._apply(lambda t: _placed_as(held[names[id(t)]], t) if id(t) in names else t)
    optimizer = optimizer_for(module)
    for name, p in module.named_parameters():
        optimizer.state[p] = {key: _placed_as(value, p) if value.dim() else value
                              for key, value in previous_optimizer.state[held[name]].items()}
    return optimizer


def touch(module: nn.Module) -> None:
    """Writes every page of this process's parameters (zeros), which ``to_empty`` only reserved."""
    with torch.no_grad():
        for p in module.parameters():
            _local(p).zero_()


def average_gradients(parameters: Iterable[torch.Tensor], group: dist.ProcessGroup) -> None:
    """Data parallelism by hand, for models whose wrapper does not reduce gradients itself."""
    size = dist.get_world_size(group)
    for p in parameters:
        grad = _local(p.grad)
        dist.all_reduce(grad, group=group)
        grad.div_(size)


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach()


def digest(module: nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """SHA-256 over the whole job's parameters and optimizer state, on rank 0 (None elsewhere).

    Collective: each rank gathers its DTensors whole, rank 0 collects what every rank holds and
    checks that replicas agree bit for bit, so the digest names the job's state whatever the
    parallelism that produced it.
    """
    named = dict(module.named_parameters())
    mine = {f"model.{name}": _whole(p) for name, p in named.items()}
    mine.update({f"optim.{name}.{key}": _whole(value)
                 for name, p in named.items() for key, value in optimizer.state[p].items()})
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if gathered is None:
        return None
    whole: dict[str, torch.Tensor] = {}
    for held in gathered:
        for name, tensor in held.items():
            if not torch.equal(whole.setdefault(name, tensor), tensor):
                raise RuntimeError(f"{name}: the replicas differ")
    sha = hashlib.sha256()
    for name in sorted(whole):
        sha.update(name.encode())
        sha.update(whole[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()
