"""monkeytree.lightning in this process: Lightning fits over a process group of one whose Job
answers its barriers as the launcher would at chosen steps (stop and save into a bytearray,
re-form the group), and replacements that resume from what was saved. A run moved or re-formed
at any step must pass through every later barrier in the state an unmigrated run has there, with
DDP and with FSDP2 (over the group of one: every parameter a DTensor of one shard)."""
from __future__ import annotations

import gc
import io
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import monkeytree
from monkeytree.hook import Directive, _leave_groups, _left_groups
from tests.simulated import Simulated, form_group

pytest.importorskip("lightning")
import lightning.pytorch as pl
import numpy as np

from monkeytree.lightning import MonkeyTreeFSDPStrategy, MonkeyTreeStrategy, Moved

# Lightning's advice (workers, logging intervals, SLURM) and its own deprecation warnings against this torch.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")

STEPS = 12
BATCHES = 5  # per epoch: 40 samples of 8


class Recorded(Simulated):
    """A simulated job that keeps the state it was in at every barrier, readable."""

    def __init__(self, tmp: Path, **kwargs: Any) -> None:
        self.states: dict[int, dict[str, Any]] = {}
        super().__init__(tmp, record=lambda step, state: self.states.__setitem__(step, _readable(state)), **kwargs)


class Disconnected(Recorded):
    """At its stop it leaves the group before it takes the state (kept in ``taken``): taking it
    must not communicate."""

    taken: Mapping[str, object] = {}

    def barrier(self, step: int, state_fn: Callable[[], Mapping[str, object]]) -> Directive:
        if step != self.stop:
            return super().barrier(step, state_fn)
        _leave_groups()
        self.taken = state_fn()
        assert self.record is not None
        self.record(step, self.taken)
        monkeytree.save(self.taken, self.saved)
        return "stop"


def _readable(state: Mapping[str, Any]) -> dict[str, Any]:
    """The state with its tensors copied and its bytes items unpickled, to compare."""
    def visit(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return _shard(value).detach().clone()
        if isinstance(value, bytes):
            return torch.load(io.BytesIO(value), weights_only=False)
        if isinstance(value, Mapping):
            return {k: visit(v) for k, v in value.items()}
        return value
    return {k: visit(v) for k, v in state.items()}


def _shard(tensor: torch.Tensor) -> torch.Tensor:
    # A DTensor's own shard: read without its mesh, which is dead once its group was left.
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _differences(a: Any, b: Any, path: str = "") -> Iterator[str]:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(_shard(a), _shard(b))):
            yield path
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not np.array_equal(a, b):
            yield path
    elif isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            yield f"{path}: keys {sorted(map(str, set(a) ^ set(b)))}"
        for key in set(a) & set(b):
            yield from _differences(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            yield f"{path}: lengths {len(a)}, {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _differences(x, y, f"{path}[{i}]")
    elif a != b:
        yield f"{path}: {a!r} != {b!r}"


def _net() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1))


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = _net()

    def training_step(self, batch: list[torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: list[torch.Tensor], _: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class Sharded(Model):
    """The model with FSDP2: the first layer and the rest in a group each."""

    def configure_model(self) -> None:
        assert self.device_mesh is not None
        mesh = self.device_mesh["data_parallel"]
        fully_shard(self.net[0], mesh=mesh)
        fully_shard(self.net, mesh=mesh)


class Built(Sharded):
    """The model with FSDP2, its network built in configure_model, when it is None."""

    def __init__(self) -> None:
        super().__init__()
        self.net = None  # type: ignore[assignment]  # Model's steps take it as built, which they may

    def configure_model(self) -> None:
        if self._modules.get("net") is None:
            self.net = _net()
            super().configure_model()


class Losses(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: Any, *_: Any) -> None:
        self.losses.append(trainer.callback_metrics["loss"].item())

    def state_dict(self) -> dict[str, Any]:
        return {"losses": self.losses}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.losses = state_dict["losses"]


def _fit(job: Simulated, accumulate: int = 1, validate: bool = False,
         sharded: type[Sharded] | None = None) -> tuple[Model, Losses]:
    """Trains to STEPS under ``job``, with DDP, or with FSDP2 given a ``sharded`` model; re-raises
    Moved when the job stops this process. With ``validate``, validation (whose shuffled loader
    draws from torch's generator) follows every second batch of an epoch."""
    pl.seed_everything(0, verbose=False)
    data = torch.utils.data.TensorDataset(torch.randn(40, 4, generator=torch.Generator().manual_seed(1)),
                                          torch.randn(40, 1, generator=torch.Generator().manual_seed(2)))
    model, losses = Model() if sharded is None else sharded(), Losses()
    strategy = (MonkeyTreeStrategy if sharded is None else MonkeyTreeFSDPStrategy)(job, process_group_backend="gloo")
    trainer = pl.Trainer(strategy=strategy, accelerator="cpu",
                         max_steps=STEPS, accumulate_grad_batches=accumulate, callbacks=[losses], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, default_root_dir=job.tmp, val_check_interval=2,
                         limit_val_batches=2 if validate else 0)
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    trainer.fit(model, loader, loader if validate else None)
    return model, losses


@pytest.fixture
def tmp(tmp_path: Path) -> Iterator[Path]:
    form_group(tmp_path)
    yield tmp_path
    if dist.is_initialized():
        dist.destroy_process_group()
    _left_groups.clear()


def _reference(tmp: Path, accumulate: int = 1, validate: bool = False,
               sharded: type[Sharded] | None = None) -> tuple[Recorded, Model, Losses]:
    job = Recorded(tmp)
    model, losses = _fit(job, accumulate, validate, sharded)
    assert sorted(job.states) == list(range(1, STEPS + 1))
    return job, model, losses


def _moved(tmp: Path, step: int, accumulate: int = 1, validate: bool = False,
           sharded: type[Sharded] | None = None) -> tuple[Recorded, Model, Losses]:
    source = Disconnected(tmp, stop=step)
    with pytest.raises(Moved) as moved:
        _fit(source, accumulate, validate, sharded)
    assert moved.value.code == 0
    assert max(source.states) == step
    form_group(tmp)
    replacement = Recorded(tmp, resume=(step, source.saved))
    model, losses = _fit(replacement, accumulate, validate, sharded)
    return replacement, model, losses


def _assert_same_run(expected: tuple[Recorded, Model, Losses], got: tuple[Recorded, Model, Losses]) -> None:
    reference, replacement = expected[0].states, got[0].states
    assert set(replacement) <= set(reference)
    for step in sorted(replacement):
        assert list(_differences(reference[step], replacement[step])) == [], f"at step {step}"
    assert list(_differences(dict(expected[1].named_parameters()), dict(got[1].named_parameters()))) == []
    assert got[2].losses == expected[2].losses


# Mid-epoch, the first step, the last of an epoch, the first of the next, and the end.
@pytest.mark.parametrize("step", [1, 3, 5, 6, 10, STEPS])
def test_a_replacement_trains_on_exactly_as_the_moved_process_would_have(tmp: Path, step: int) -> None:
    expected = _reference(tmp)
    got = _moved(tmp, step)
    assert min(got[0].states, default=STEPS) == (step + 1 if step < STEPS else STEPS)
    _assert_same_run(expected, got)


# After a validation, after the last batch of an epoch (no validation), after the first (none either).
@pytest.mark.parametrize("step", [4, 5, 6])
def test_a_replacement_does_not_redo_or_skip_the_validation_of_the_step_it_resumes_after(tmp: Path, step: int) -> None:
    _assert_same_run(_reference(tmp, validate=True), _moved(tmp, step, validate=True))


def test_with_gradient_accumulation_the_barrier_counts_optimizer_steps(tmp: Path) -> None:
    expected = _reference(tmp, accumulate=2)
    # Lightning steps after batches 2, 4 and 5 of an epoch of 5: 12 steps take 4 epochs.
    assert len(expected[2].losses) == 4 * BATCHES
    # Step 4 follows the second batch of the second epoch: the loader resumes at its third.
    _assert_same_run(expected, _moved(tmp, 4, accumulate=2))


def test_a_re_formed_group_gets_a_new_ddp_wrapper_and_training_carries_on(
        tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = _reference(tmp)
    job = Recorded(tmp, reform=4)
    wrappers: list[weakref.ref[torch.nn.Module]] = []
    original = MonkeyTreeStrategy.configure_ddp

    def configure_ddp(self: MonkeyTreeStrategy) -> None:
        original(self)
        assert self.model is not None
        wrappers.append(weakref.ref(self.model))

    monkeypatch.setattr(MonkeyTreeStrategy, "configure_ddp", configure_ddp)
    got = _fit(job)
    assert job.generation == 1
    assert len(wrappers) == 2
    gc.collect()
    assert [ref() for ref in wrappers] == [None, None]
    _assert_same_run(expected, (job, *got))


# Mid-epoch, the last step of an epoch, and the end.
@pytest.mark.parametrize("step", [3, 5, STEPS])
def test_under_fsdp_a_replacement_trains_on_exactly_from_the_shards_the_moved_process_saved(
        tmp: Path, step: int) -> None:
    _assert_same_run(_reference(tmp, sharded=Sharded), _moved(tmp, step, sharded=Sharded))


def test_under_fsdp_a_moving_process_saves_its_shards_and_its_optimizer_state_of_them_as_dtensors(
        tmp: Path) -> None:
    source = Disconnected(tmp, stop=2)
    with pytest.raises(Moved):
        _fit(source, sharded=Sharded)
    model, optimizer = source.taken["state_dict"], source.taken["optimizer_states"]
    assert isinstance(model, dict)
    assert isinstance(optimizer, dict)
    assert sorted(model) == ["net.0.bias", "net.0.weight", "net.2.bias", "net.2.weight"]
    assert all(isinstance(t, DTensor) for t in model.values())
    assert all(isinstance(state[key], DTensor)
               for state in optimizer["0"].values() for key in ("exp_avg", "exp_avg_sq"))


# A model built in __init__ and sharded in configure_model, and one built there too.
@pytest.mark.parametrize("sharded", [Sharded, Built])
def test_under_fsdp_a_re_formed_group_gets_new_sharded_modules_filled_exactly(
        tmp: Path, monkeypatch: pytest.MonkeyPatch, sharded: type[Sharded]) -> None:
    expected = _reference(tmp, sharded=sharded)
    job = Recorded(tmp, reform=4)
    nets: list[weakref.ref[torch.nn.Module]] = []
    original = sharded.configure_model

    def configure_model(self: Sharded) -> None:
        original(self)
        nets.append(weakref.ref(self.net))

    monkeypatch.setattr(sharded, "configure_model", configure_model)
    got = _fit(job, sharded=sharded)
    assert job.generation == 1
    assert len(nets) == 2
    gc.collect()
    assert nets[0]() is None
    assert nets[1]() is got[0].net
    _assert_same_run(expected, (job, *got))


class Once(Sharded):
    """Shards only at its first configure_model."""

    def configure_model(self) -> None:
        if not hasattr(self, "sharded"):
            super().configure_model()
            self.sharded = True


def test_under_fsdp_a_configure_model_that_does_not_shard_again_fails_the_re_form(tmp: Path) -> None:
    job = Recorded(tmp, reform=2)
    trainer = pl.Trainer(strategy=MonkeyTreeFSDPStrategy(job, process_group_backend="gloo"), accelerator="cpu",
                         max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=job.tmp)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    with pytest.raises(RuntimeError, match="configure_model did not shard"):
        trainer.fit(Once(), torch.utils.data.DataLoader(data, batch_size=8))
