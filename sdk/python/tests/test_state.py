"""save and load through DCP into a bytearray, in this process: no staging buffer, no process group."""
from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

import monkeytree
from monkeytree.layout import Checkpoint, CheckpointError


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
    return model, optimizer


def _code(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(CheckpointError) as caught:
        call(*args, **kwargs)
    return caught.value.code


def test_a_training_state_round_trips_into_fresh_objects() -> None:
    model, optimizer = _trained()
    buffer = bytearray(1 << 20)
    rng = monkeytree.rng_state()
    state = {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": 2, "rng": rng}
    length = monkeytree.save(state, buffer)
    assert Checkpoint(buffer).length == length

    model2 = _model()
    optimizer2 = torch.optim.Adam(model2.parameters(), lr=1e-2)
    monkeytree.init_optimizer_state(optimizer2)
    target: dict[str, Any] = {"model": model2.state_dict(), "optim": optimizer2.state_dict(), "step": 0, "rng": b""}
    monkeytree.load(target, buffer)
    model2.load_state_dict(target["model"])
    optimizer2.load_state_dict(target["optim"])
    assert target["step"] == 2
    assert target["rng"] == rng
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    assert optimizer2.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]
    for saved, loaded in zip(optimizer.state.values(), optimizer2.state.values()):
        assert all(torch.equal(saved[key], loaded[key]) for key in ("exp_avg", "exp_avg_sq", "step"))


def test_nested_keys_become_dotted_fqns_and_bytes_are_stored_verbatim() -> None:
    buffer = bytearray(1 << 16)
    state = {"a": {"b": torch.arange(3, dtype=torch.int16), "c": {1: b"\x00raw\xff"}}, "n": 7, "empty": {}}
    monkeytree.save(state, buffer)
    checkpoint = Checkpoint(buffer)
    assert sorted(checkpoint.items) == ["a.b", "a.c.1", "empty", "n"]
    assert bytes(checkpoint.view(checkpoint.blob("a.c.1"))) == b"\x00raw\xff"
    tensor = checkpoint.items["a.b"]
    assert tensor["kind"] == "tensor"
    assert (tensor["dtype"], tensor["size"]) == ("int16", [3])
    assert bytes(checkpoint.view(checkpoint.chunks("a.b")[0])) == torch.arange(3, dtype=torch.int16).numpy().tobytes()
    # Values other than tensors and bytes are torch.save pickles, and load gives them back.
    target: dict[str, Any] = {"a": {"b": torch.zeros(3, dtype=torch.int16), "c": {1: b""}}, "n": 0, "empty": None}
    monkeytree.load(target, buffer)
    assert target["n"] == 7
    assert target["empty"] == {}
    assert target["a"]["c"][1] == b"\x00raw\xff"
    assert torch.equal(target["a"]["b"], torch.arange(3, dtype=torch.int16))


def test_an_optimizer_without_per_parameter_state_round_trips() -> None:
    # SGD without momentum keeps its ``state`` an empty dict, which is an item like any other.
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    buffer = bytearray(1 << 16)
    monkeytree.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, buffer)
    assert Checkpoint(buffer).items["optim.state"]["kind"] == "bytes"
    fresh = torch.optim.SGD(_model().parameters(), lr=0.5)
    target = {"optim": fresh.state_dict()}
    monkeytree.load(target, buffer)
    assert target["optim"]["state"] == {}
    assert target["optim"]["param_groups"][0]["lr"] == 0.1


def test_a_range_of_a_larger_buffer_holds_the_checkpoint() -> None:
    buffer = bytearray(3 << 14)
    first = {"x": torch.full((16,), 1.0)}
    second = {"x": torch.full((16,), 2.0)}
    monkeytree.save(first, buffer, offset=0, length=1 << 14)
    monkeytree.save(second, buffer, offset=1 << 14, length=1 << 14)
    target = {"x": torch.zeros(16)}
    monkeytree.load(target, buffer, offset=1 << 14, length=1 << 14)
    assert torch.equal(target["x"], second["x"])
    monkeytree.load(target, buffer, offset=0, length=1 << 14)
    assert torch.equal(target["x"], first["x"])
    with pytest.raises(ValueError, match=r"range \[40000, 60000\) lies outside the buffer's 49152 bytes"):
        monkeytree.save(first, buffer, offset=40_000, length=20_000)


def test_two_entries_that_flatten_to_one_name_are_duplicate_fqn() -> None:
    with pytest.raises(CheckpointError, match=r"a\.b: two entries of the state dict flatten to this name") as caught:
        monkeytree.save({"a": {"b": 1}, "a.b": 2}, bytearray(1 << 16))
    assert caught.value.code == "duplicate_fqn"


def test_a_buffer_that_cannot_hold_the_state_is_too_small() -> None:
    assert _code(monkeytree.save, {"w": torch.zeros(1000)}, bytearray(2048)) == "too_small"


def test_a_dtype_the_format_lacks_is_invalid_item() -> None:
    with pytest.raises(CheckpointError, match="dtype uint16 cannot be stored") as caught:
        monkeytree.save({"w": torch.zeros(4, dtype=torch.uint16)}, bytearray(1 << 16))
    assert caught.value.code == "invalid_item"


@pytest.mark.parametrize(("template", "code", "message"), [
    ({"w": torch.zeros(2, 3), "missing": 1}, "unknown_fqn", "the checkpoint has no item named missing"),
    ({"w": b"", "n": 0}, "unknown_fqn", "w: the checkpoint holds a tensor, the state dict a bytes"),
    ({"w": torch.zeros(2, 3), "n": torch.zeros(1)}, "unknown_fqn", "n: the checkpoint holds a bytes item"),
    ({"w": torch.zeros(3, 2)}, "invalid_item",
     r"w: the checkpoint holds float32\[2, 3\], the state dict float32\[3, 2\]"),
    ({"w": torch.zeros(2, 3, dtype=torch.float64)}, "invalid_item", "the state dict float64"),
])
def test_a_template_that_differs_from_the_checkpoint_is_refused(template: dict[str, Any], code: str,
                                                                 message: str) -> None:
    buffer = bytearray(1 << 16)
    monkeytree.save({"w": torch.ones(2, 3), "n": 5}, buffer)
    with pytest.raises(CheckpointError, match=message) as caught:
        monkeytree.load(template, buffer)
    assert caught.value.code == code


def test_a_changed_stored_byte_fails_the_load_with_checksum_mismatch() -> None:
    buffer = bytearray(1 << 16)
    monkeytree.save({"w": torch.ones(8)}, buffer)
    buffer[Checkpoint(buffer).chunks("w")[0].offset + 3] ^= 0x01
    with pytest.raises(CheckpointError, match=r"^w chunks\[0\]: CRC32C of bytes") as caught:
        monkeytree.load({"w": torch.zeros(8)}, buffer)
    assert caught.value.code == "checksum_mismatch"


def test_a_buffer_without_a_checkpoint_is_bad_header() -> None:
    assert _code(monkeytree.load, {"w": torch.zeros(1)}, bytearray(1024)) == "bad_header"


def test_rng_state_restores_torch_and_python_generators() -> None:
    saved = monkeytree.rng_state()
    expected = (torch.rand(3), random.random())
    monkeytree.set_rng_state(saved)
    again = (torch.rand(3), random.random())
    assert torch.equal(expected[0], again[0])
    assert expected[1] == again[1]


def test_init_optimizer_state_creates_moments_without_moving_parameters() -> None:
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.Adam(model.parameters(), lr=0.5)
    monkeytree.init_optimizer_state(optimizer)
    assert len(optimizer.state) == len(before)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    assert optimizer.param_groups[0]["lr"] == 0.5


@pytest.mark.parametrize("make", [
    lambda params: torch.optim.Adam(params, lr=0.5),
    lambda params: torch.optim.AdamW(params, lr=0.5, amsgrad=True),
    lambda params: torch.optim.SGD(params, lr=0.5, momentum=0.9),
])
def test_init_optimizer_state_matches_what_a_first_step_creates(make: Callable[[Any], torch.optim.Optimizer]) -> None:
    made, stepped = _model(), _model()
    optimizer, reference = make(made.parameters()), make(stepped.parameters())
    monkeytree.init_optimizer_state(optimizer)
    for p in stepped.parameters():
        p.grad = torch.zeros_like(p)
    reference.step()
    for mine, theirs in zip(optimizer.state_dict()["state"].values(), reference.state_dict()["state"].values()):
        assert sorted(mine) == sorted(theirs)
        for key, value in theirs.items():
            assert (mine[key].dtype, mine[key].shape) == (value.dtype, value.shape), key
