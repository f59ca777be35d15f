"""What a replacement learns and builds before attach: its expected place and a placeholder group."""
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from monkeytree import ahead, hook
from monkeytree.ahead import Place


def _environment(monkeypatch: pytest.MonkeyPatch, **values: str | None) -> None:
    for name, value in values.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


RESUMING = {hook.CHANNEL_ENV: "/run/launcher.sock", hook.RESUMING_ENV: "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}


@pytest.mark.parametrize(("changes", "expected"), [
    ({ahead.EXPECTED_NODE_RANK_ENV: "1", ahead.EXPECTED_NODES_ENV: "3"}, Place(3, 6)),
    ({ahead.EXPECTED_NODE_RANK_ENV: "0", ahead.EXPECTED_NODES_ENV: "1", "LOCAL_RANK": "0"}, Place(0, 2)),
    ({ahead.EXPECTED_NODE_RANK_ENV: "1", ahead.EXPECTED_NODES_ENV: "3", hook.RESUMING_ENV: "0"}, None),
    ({ahead.EXPECTED_NODE_RANK_ENV: None, ahead.EXPECTED_NODES_ENV: "3"}, None),  # a launcher that does not say
    ({ahead.EXPECTED_NODE_RANK_ENV: "3", ahead.EXPECTED_NODES_ENV: "3"}, None),  # no such node
    ({ahead.EXPECTED_NODE_RANK_ENV: "-1", ahead.EXPECTED_NODES_ENV: "3"}, None),
    ({ahead.EXPECTED_NODE_RANK_ENV: "1", ahead.EXPECTED_NODES_ENV: "3", "LOCAL_WORLD_SIZE": None}, None),
])
def test_a_replacement_knows_its_place_before_attach(monkeypatch: pytest.MonkeyPatch, changes: dict[str, str | None],
                                                     expected: Place | None) -> None:
    _environment(monkeypatch, **{**RESUMING, **changes})
    assert ahead.expected_place() == expected


def test_a_placeholder_group_lays_out_this_ranks_shards_then_goes() -> None:
    with ahead.placeholder_group(Place(1, 4)):
        assert (dist.get_rank(), dist.get_world_size()) == (1, 4)
        with torch.device("meta"):
            layer = nn.Linear(8, 16)
        fully_shard(layer, mesh=init_device_mesh("cpu", (4,)))
        layer.to_empty(device="cpu")
        weight = layer.weight
        assert isinstance(weight, DTensor)
        # Rank 1's quarter of the rows, in memory of its own.
        assert weight.to_local().shape == (4, 8)
        assert weight.to_local().device.type == "cpu"
    assert not dist.is_initialized()


def test_a_placeholder_group_is_only_for_a_process_without_one() -> None:
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        with pytest.raises(RuntimeError, match="already has a process group"), ahead.placeholder_group(Place(0, 2)):
            pass
    finally:
        dist.destroy_process_group()
