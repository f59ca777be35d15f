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


def _own(module: nn.Module, optimizer: torch.optim.Optimizer, view: Callable[[torch.Tensor], torch.Tensor]) -> dict:
    named = dict(module.named_parameters())
    return {"model": {name: view(p) for name, p in named.items()},
            "optim": {name: {key: view(value) for key, value in optimizer.state[p].items()}
                      for name, p in named.items()}}


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
    return _own(module, optimizer, torch.Tensor.detach)


def local_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The same tensors as local ones, which need no process group, not even a live one: what a
    re-formed group's new objects are filled from."""
    return _own(module, optimizer, _local)


def _placed_as(tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``tensor``'s local piece, placed as ``like`` is: a DTensor on ``like``'s mesh over the same memory."""
    local = _local(tensor)
    if not isinstance(like, DTensor):
        return local
    return DTensor.from_local(local, like.device_mesh, like.placements, shape=like.shape, stride=like.stride())


def adopt_parameters(module: nn.Module, previous: nn.Module) -> None:
    """Gives every parameter of ``module``, built for a new process group on the meta device, the
    memory of its namesake in ``previous``: sliced ones stay DTensors, now on the new mesh, over the
    same local tensors. Nothing is allocated or copied."""
    held = dict(previous.named_parameters())
    for name, p in list(module.named_parameters()):
        owner, _, leaf = name.rpartition(".")
        placed = nn.Parameter(_placed_as(held[name], p), requires_grad=p.requires_grad)
        setattr(module.get_submodule(owner), leaf, placed)


def adopted(module: nn.Module, previous: nn.Module) -> bool:
    """Whether ``module``'s parameters are ``previous``'s memory (``adopt_parameters``)."""
    held = dict(previous.named_parameters())
    return all(_local(p).data_ptr() == _local(held[name]).data_ptr() for name, p in module.named_parameters())


def adopt_optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer, previous: nn.Module,
                          previous_optimizer: torch.optim.Optimizer) -> None:
    """Gives ``optimizer`` the state ``previous_optimizer`` holds for the parameters ``module`` adopted,
    placed as those parameters are."""
    held = dict(previous.named_parameters())
    for name, p in module.named_parameters():
        optimizer.state[p] = {key: _placed_as(value, p) if value.dim() else value
                              for key, value in previous_optimizer.state[held[name]].items()}


def fill(target: dict, source: dict) -> None:
    """Copies every tensor of ``source`` into its counterpart in ``target``, exactly."""
    with torch.no_grad():
        for key, value in target.items():
            if isinstance(value, dict):
                fill(value, source[key])
            else:
                value.copy_(source[key])


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
