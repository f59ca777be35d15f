"""What a replacement can build before ``attach``, while the job it joins still trains.

A replacement's ``attach`` is answered only once its move commits, with the job stopped. Its
launcher tells it beforehand that it resumes (``resuming``) and the place it will most likely
take in the job (``expected_place``); under ``placeholder_group`` it can then build even the
share of a sharded model (FSDP2, tensor or pipeline parallel) that place holds, and touch its
memory, so that after ``attach`` it re-forms around that memory and loads into it.
"""
from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch.distributed as dist

from .hook import resuming

EXPECTED_NODE_RANK_ENV = "MONKEYTREE_EXPECTED_NODE_RANK"
EXPECTED_NODES_ENV = "MONKEYTREE_EXPECTED_NODES"


class Place(NamedTuple):
    """A process's rank and the world size of the process group it will be part of."""

    rank: int
    world_size: int


def _whole(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def expected_place() -> Place | None:
    """The rank and world size this replacement's process will most likely get from ``attach``;
    None in a process that does not resume, or where its launcher did not say.

    A forecast, made when the move started: a change to the job that commits before this move
    (another worker leaving, say) changes it. Build on it only what ``attach``'s group can take
    over or drop, and form the process group with what ``attach`` returns.
    """
    if not resuming():
        return None
    node_rank, nodes = _whole(EXPECTED_NODE_RANK_ENV), _whole(EXPECTED_NODES_ENV)
    local_rank, local_world = _whole("LOCAL_RANK"), _whole("LOCAL_WORLD_SIZE")
    if node_rank is None or nodes is None or local_rank is None or local_world is None:
        return None
    if node_rank >= nodes or local_rank >= local_world:
        return None
    return Place(node_rank * local_world + local_rank, nodes * local_world)


@contextmanager
def placeholder_group(place: Place) -> Iterator[None]:
    """The default process group, for the block, as one of ``place.world_size`` processes at
    ``place.rank`` that communicates nothing: device meshes, FSDP2's ``fully_shard`` and tensor
    parallel plans built under it lay out this rank's shards as the real group will, without a
    peer. Every collective under it returns without moving data (torch's "fake" backend).

    Raises:
        RuntimeError: a process group already exists.
    """
    if dist.is_initialized():
        raise RuntimeError("placeholder_group() is for before attach(); this process already has a process group")
    # Importing it registers the backend, which torch keeps with its test utilities.
    importlib.import_module("torch.testing._internal.distributed.fake_pg")
    dist.init_process_group("fake", rank=place.rank, world_size=place.world_size, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()
