"""MonkeyTree for PyTorch Lightning: a ``Trainer.fit`` whose processes MonkeyTree can move between
hosts while it runs, with one argument to the Trainer::

    trainer = Trainer(strategy=monkeytree.lightning.strategy(), ...)           # DDP
    trainer = Trainer(strategy=monkeytree.lightning.strategy(fsdp=True), ...)  # FSDP2

``strategy()`` attaches to the job (``monkeytree.attach``) and returns a strategy that Lightning
runs as usual: ``MonkeyTreeStrategy``, Lightning's ``DDPStrategy``; with ``fsdp=True``,
``MonkeyTreeFSDPStrategy``, Lightning's ``ModelParallelStrategy`` with one data-parallel dimension
over every process, where the LightningModule's ``configure_model`` applies ``fully_shard``. Both
are ``Migratable``: they differ from Lightning's in that

- their ranks, world size and local rank are the job's (``JobEnvironment``); Lightning finds the
  process group formed and does not form its own. The Trainer's ``devices`` and ``num_nodes``
  play no part: each process trains on one device, the one its local rank names on a GPU host;
- after every training batch that stepped the optimizer, once Lightning is done with that
  batch (validation, LR schedulers, logging, the end of an epoch's batches), it meets the job at
  ``job.barrier(global_step, ...)``. There a process that moves away saves everything Lightning
  would restore from a checkpoint, and more (below), and leaves the Trainer by raising ``Moved``
  (a ``SystemExit`` with status 0, so the script ends there); on a re-formed group the strategy
  builds anew what it built on the old one (a DDP wrapper; FSDP's device mesh and sharded
  modules) and training carries on;
- a replacement (``job.resuming``) restores all of it before its first batch and trains on
  from the batch the moved process would have drawn next.

What a moved process carries: the model's state dict and each optimizer's state as tensors (DCP
items ``state_dict.*`` and ``optimizer_states.<i>.*``, named as in a Lightning checkpoint), as
this process holds them: under FSDP, DTensors of its own shards, nothing gathered; in one bytes
item ``lightning``, the rest of Lightning's own checkpoint (``dump_checkpoint``: loop progress,
callbacks' and LR schedulers' state, optimizers' param groups, precision plugin, datamodule,
hyperparameters, what ``on_save_checkpoint`` hooks add) and ``trainer.should_stop``; in ``rng``,
this process's random number generators (torch, CUDA, numpy, Python). Callbacks' state may differ
between ranks: export several processes' checkpoints with ``--per-source lightning``. The data
loader's position is the loop's: a replacement draws and drops the batches this epoch already used
(Lightning restores a loader that has ``state_dict``/``load_state_dict`` itself).

Under plain torchrun (no ``$MONKEYTREE_CHANNEL``) every barrier continues at once and the
strategy is Lightning's DDP with ``find_unused_parameters=True`` (see ``MonkeyTreeStrategy``), or
Lightning's FSDP2.

Not carried: the running epoch-level aggregates of metrics logged with ``on_epoch=True`` (Lightning
does not checkpoint them either), loggers' own state, a ``DataLoader``'s worker seeds. One
``fit`` per Trainer; DDP and FSDP2 over all processes (FSDP1, DeepSpeed, tensor and pipeline
parallelism are not covered).
"""
from __future__ import annotations

import copy
import gc
import os
from abc import abstractmethod
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from itertools import chain
from typing import Any, TypeVar

import torch
from lightning.fabric.plugins.environments.cluster_environment import ClusterEnvironment
from lightning.fabric.utilities.data import _set_sampler_epoch
from lightning.fabric.utilities.init import _has_meta_device_parameters_or_buffers
from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states
from lightning.fabric.utilities.types import _Stateful
from lightning.pytorch import Trainer
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.loops.fetchers import _DataFetcher, _DataLoaderIterDataFetcher
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, ParallelStrategy
from lightning.pytorch.trainer.call import _call_configure_model
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor
from torch.distributed import ReduceOp
from torch.distributed.constants import default_pg_timeout
from torch.distributed.tensor import DTensor
from torch.nn import Module, Parameter
from torch.optim import Optimizer

from .hook import CHANNEL_ENV, Job, attach
from .state import from_bytes, init_optimizer_state, to_bytes

_T = TypeVar("_T")
#: The state a process saves when it moves: tensors, nested dicts of them, and bytes.
State = dict[str, Any]


class Moved(SystemExit):
    """Raised out of ``Trainer.fit`` in a process whose training moved to another host: its
    replacement trains on from here. Unhandled, it ends the script with exit status 0."""

    def __init__(self) -> None:
        super().__init__(0)


class JobEnvironment(ClusterEnvironment):
    """The job's ranks as Lightning asks for them. They are read on every call, so they follow
    the job when its group is re-formed; Lightning's setters are ignored (the launcher decides)."""

    def __init__(self, job: Job) -> None:
        super().__init__()
        self.job = job

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        # Lightning asks only to form a process group, which attach has formed already.
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "0"))

    @staticmethod
    def detect() -> bool:
        return CHANNEL_ENV in os.environ

    def world_size(self) -> int:
        return self.job.world_size

    def set_world_size(self, size: int) -> None:
        pass

    def global_rank(self) -> int:
        return self.job.rank

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return self.job.local_rank

    def node_rank(self) -> int:
        per_host = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        return (self.job.rank - self.job.local_rank) // per_host


def _rng_states() -> dict[str, Any]:
    # CUDA's generators only once this process uses CUDA: asking for them would initialise it.
    # torch leaves is_initialized unannotated.
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    return _collect_rng_states(include_cuda=cuda)


def _local(tensor: Tensor) -> Tensor:
    # A DTensor's shard, sharing its storage; reading it needs no process group, not even a live one.
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class Migratable(ParallelStrategy):
    """What makes a Lightning strategy's processes movable (see the module's description): the
    job's ranks, a barrier after every optimizer step, the state a moving process saves, and the
    restore of a replacement. A subclass comes before Lightning's strategy in the bases, and
    ``_rebuild`` builds anew what that strategy built on the process group, once the job re-formed it."""

    def __init__(self, job: Job, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cluster_environment = JobEnvironment(job)
        self.job = job
        self._shape = (job.rank, job.world_size)
        # The optimizer steps done when this process last met the job.
        self._met = 0
        # A replacement restores its state once the Trainer is set up; until its first batch its
        # peers are training, so what Lightning synchronises while it starts up it must not.
        self._restoring = job.resuming
        self._alone = job.resuming
        self._resumed: tuple[dict[str, Any], int] | None = None
        self._trainer: Trainer | None = None
        # While this process takes the state it saves: Lightning's own way of taking it may communicate.
        self._saving = False

    @property
    def root_device(self) -> torch.device:
        # One device per process: on a CPU host Lightning lists a single one.
        devices = self.parallel_devices
        assert devices, "Lightning sets the devices before it asks for the root device"
        return devices[0] if devices[0].type == "cpu" else devices[self.local_rank]

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    # Lightning's strategy, after this class in a subclass's bases, implements the collectives
    # that Strategy declares abstract.
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if not self._alone:
            super().barrier(*args, **kwargs)  # type: ignore[safe-super]

    def broadcast(self, obj: _T, src: int = 0) -> _T:
        return obj if self._alone else super().broadcast(obj, src)  # type: ignore[safe-super]

    def reduce(self, tensor: Tensor, group: Any | None = None,
               reduce_op: ReduceOp | str | None = "mean") -> Tensor:
        return tensor if self._alone else super().reduce(tensor, group, reduce_op)  # type: ignore[safe-super]

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return decision if self._alone else super().reduce_boolean_decision(decision, all)

    def setup(self, trainer: Trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        self._trainer = trainer
        loop = trainer.fit_loop.epoch_loop
        if "on_advance_end" not in vars(loop):
            # The end of a batch's advance is where Lightning is done with it and has not yet
            # drawn the next one: no collective is in flight, and nothing of this step is left
            # for a replacement to redo. Lightning offers no hook there.
            on_advance_end = loop.on_advance_end

            def meet_after(data_fetcher: _DataFetcher) -> None:
                on_advance_end(data_fetcher)
                if not _is_max_limit_reached(trainer.global_step, trainer.max_steps):
                    self._meet(trainer)

            setattr(loop, "on_advance_end", meet_after)  # noqa: B010 (mypy refuses to assign to a method)
        if self._restoring:
            self._restoring = False
            self._restore(trainer)

    def on_train_start(self) -> None:
        super().on_train_start()
        if self._resumed is not None:
            assert self._trainer is not None
            self._reposition(self._trainer, *self._resumed)
            self._resumed = None
        self._alone = False

    def on_train_end(self) -> None:
        super().on_train_end()
        # The last step meets the job here, after the epoch's end: a replacement resumed from it
        # finds training done and runs no hook that the others ran after it.
        if self._trainer is not None:
            self._meet(self._trainer)

    def teardown(self) -> None:
        super().teardown()
        self._alone = False
        # Frees the DDP wrapper or FSDP's modules now: while the hook still holds a group this
        # process left, so that the group is not destroyed from their destructors (see hook.py).
        gc.collect()

    def lightning_module_state_dict(self) -> dict[str, Any]:
        if self._saving:
            assert self.lightning_module is not None
            return self.lightning_module.state_dict()
        return super().lightning_module_state_dict()

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        if self._saving:
            return (optimizer._optimizer if isinstance(optimizer, LightningOptimizer) else optimizer).state_dict()
        return super().optimizer_state(optimizer)

    def _meet(self, trainer: Trainer) -> None:
        step = trainer.global_step
        if step == self._met:
            return
        self._met = step
        directive = self.job.barrier(step, lambda: self.state(trainer))
        if directive == "stop":
            raise Moved
        if directive == "reconfigured":
            self._reform()

    def _reform(self) -> None:
        if (self.global_rank, self.world_size) != self._shape:
            raise RuntimeError(f"the job re-formed this process as rank {self.global_rank} of {self.world_size},"
                               f" not {self._shape[0]} of {self._shape[1]}: Lightning's data loaders were"
                               " split for the old shape")
        self._rebuild()
        gc.collect()

    @abstractmethod
    def _rebuild(self) -> None:
        """Builds anew, on the re-formed group, what the strategy built on the old one."""

    def state(self, trainer: Trainer) -> State:
        """What this process saves when it moves; in a replacement, the template that
        ``job.load`` fills. Nothing in it communicates: the other processes are waiting outside
        torch meanwhile. Its tensors are the model's and optimizers' own (a state dict's detached
        views), so filling them fills the model and the optimizers."""
        self._saving = True
        try:
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        finally:
            self._saving = False
        model = checkpoint.pop("state_dict")
        optimizers = checkpoint.pop("optimizer_states")
        checkpoint["optimizer_states"] = [{k: v for k, v in o.items() if k != "state"} for o in optimizers]
        checkpoint["should_stop"] = trainer.should_stop
        checkpoint["last_train_dl_reload_epoch"] = trainer.fit_loop._last_train_dl_reload_epoch
        return {"state_dict": model,
                "optimizer_states": {str(i): o["state"] for i, o in enumerate(optimizers)},
                "lightning": to_bytes(checkpoint),
                "rng": to_bytes(_rng_states())}

    def _restore(self, trainer: Trainer) -> None:
        # Adam's moments exist only after a first step; load fills them in place.
        for optimizer in self.optimizers:
            init_optimizer_state(optimizer)
        loaded = self.job.load(self.state(trainer))
        checkpoint = from_bytes(loaded["lightning"])
        checkpoint["state_dict"] = loaded["state_dict"]
        checkpoint["optimizer_states"] = [{**rest, "state": loaded["optimizer_states"][str(i)]}
                                          for i, rest in enumerate(checkpoint["optimizer_states"])]
        connector = trainer._checkpoint_connector
        connector._loaded_checkpoint = checkpoint
        try:
            connector.restore_datamodule()
            connector.restore_model()
            connector.restore_callbacks()
            connector.restore_training_state()
        finally:
            connector._loaded_checkpoint = {}
        if not self.lightning_restore_optimizer:
            # A strategy that loads its optimizers itself from a checkpoint's files (FSDP's) leaves
            # their param groups (learning rates) to that: load has filled only their tensors.
            for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
                optimizer.load_state_dict(state)
        trainer.should_stop = checkpoint["should_stop"]
        self._met = trainer.global_step
        if self._met != self.job.resume_step:
            raise RuntimeError(f"the checkpoint holds step {self._met}, the launcher resumes at {self.job.resume_step}")
        self._resumed = (from_bytes(loaded["rng"]), checkpoint["last_train_dl_reload_epoch"])
        # The state was taken between two batches, with every counter of the batch before
        # complete: Lightning's restart, made for checkpoints taken within a batch
        # (on_train_batch_end, on_validation_end), would redo part of it. The fit loop's restart
        # (resume mid-epoch: no epoch-start hooks again) is right; the epoch loop must go on as is.
        epoch_loop = trainer.fit_loop.epoch_loop

        def go_on() -> None:
            delattr(epoch_loop, "reset")
            epoch_loop.restarting = False

        setattr(epoch_loop, "reset", go_on)  # noqa: B010 (mypy refuses to assign to a method)

    def _reposition(self, trainer: Trainer, rng: dict[str, Any], reload_epoch: int) -> None:
        """Moves the epoch's data loader past the batches it already gave, then sets the random
        generators as they were when the moved process saved: after the loader was created (which
        draws its seed), before it gave the next batch."""
        fit_loop = trainer.fit_loop
        fit_loop._last_train_dl_reload_epoch = reload_epoch
        epoch_loop = fit_loop.epoch_loop
        fetcher, loader = fit_loop._data_fetcher, fit_loop._combined_loader
        drawn = epoch_loop.batch_progress.current.ready
        if (fetcher is not None and loader is not None and drawn and not epoch_loop._num_ready_batches_reached()
                and not all(isinstance(dl, _Stateful) for dl in loader.flattened)):
            if isinstance(fetcher, _DataLoaderIterDataFetcher):
                raise NotImplementedError("a training_step that takes the dataloader_iter cannot resume mid-epoch:"
                                          " how many batches it drew is not recorded")
            for dl in loader.flattened:
                _set_sampler_epoch(dl, trainer.current_epoch)
            for _ in range(drawn):
                next(fetcher)
            # The epoch loop counts the batches it already ran as fetched itself.
            fetcher.fetched -= drawn
        _set_rng_states(rng)


class MonkeyTreeStrategy(Migratable, DDPStrategy):
    """Lightning's DDP strategy for a process of ``job`` (see the module's description).

    ``find_unused_parameters`` defaults to True although a model may use every parameter: with
    it, DDP keeps its gradient buckets as first laid out, so the wrapper built anew after a
    re-formed group (or in a replacement) sums gradients in the same order as the one it
    replaces; otherwise DDP lays the buckets out again after its first iteration, and the first
    step after a re-form would add in another order (other bits once more than two ranks sum).
    """

    def __init__(self, job: Job, **kwargs: Any) -> None:
        kwargs.setdefault("find_unused_parameters", True)
        super().__init__(job, **kwargs)
        if job.resuming:
            self._without_init_sync()

    def _without_init_sync(self) -> None:
        # DDP's construction checks that every rank's parameters have the same shapes and copies
        # rank 0's to the others: collectives a replacement and the processes that stayed would
        # not both make (they build their wrappers at different points), and a copy that would
        # overwrite trained parameters with a replacement's freshly initialised ones.
        self._ddp_kwargs["init_sync"] = False

    def _rebuild(self) -> None:
        self._without_init_sync()
        self.model = self.lightning_module
        self.configure_ddp()


class MonkeyTreeFSDPStrategy(Migratable, ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` for a process of ``job``: its device mesh has one
    data-parallel dimension over all the job's processes (``self.device_mesh["data_parallel"]``
    in ``configure_model``, which shards the LightningModule's modules with ``fully_shard``) and a
    tensor-parallel dimension of one.

    On a re-formed group the mesh and every module sharded on it are dead. The strategy makes the
    mesh anew, puts back the LightningModule's children that hold sharded parameters as they were
    before ``configure_model`` first ran (unsharded, on the meta device; None where
    ``configure_model`` created them), runs ``configure_model`` again, and fills this process's
    shards of the new parameters and buffers, and its optimizers' state of them, with what the
    old ones held, exactly. So ``configure_model`` must shard what it finds unsharded, as it does
    the first time, and the LightningModule itself must not be sharded (only its children).
    """

    def __init__(self, job: Job, **kwargs: Any) -> None:
        super().__init__(job, data_parallel_size=job.world_size, tensor_parallel_size=1, **kwargs)
        # The LightningModule's children as configure_model first found them, each parameter on
        # the meta device: what a re-formed group's modules are built from. Only a managed job
        # re-forms.
        self._plain: dict[str, Module] | None = None

    @contextmanager
    def model_sharded_context(self) -> Generator[None, None, None]:
        if self._plain is None and self.job.managed:
            assert self.lightning_module is not None
            self._plain = _meta_copy(dict(self.lightning_module.named_children()))
        with super().model_sharded_context():
            yield

    def _rebuild(self) -> None:
        module, trainer, plain = self.lightning_module, self._trainer, self._plain
        assert module is not None
        assert trainer is not None
        assert plain is not None
        held = _tensors(module)
        # Lightning seeds the generators again while it sets up, and configure_model may draw.
        rng = _rng_states()
        # Lightning makes the device mesh there, on the group it finds.
        self.setup_environment()
        plain = copy.deepcopy(plain)
        for name, child in list(module.named_children()):
            if any(isinstance(p, DTensor) for p in child.parameters()):
                setattr(module, name, plain.get(name))
        _call_configure_model(trainer)
        for child in module.children():
            if _has_meta_device_parameters_or_buffers(child):
                child.to_empty(device=self.root_device)
        built = _tensors(module)
        stale = [n for n, t in built.items()
                 if isinstance(held.get(n), DTensor) and (t is held[n] or not isinstance(t, DTensor))]
        if built.keys() != held.keys() or stale:
            raise RuntimeError("on the re-formed group configure_model did not shard the LightningModule's modules as"
                               " at first: given its children back unsharded, it must shard them again"
                               f" (parameters {stale or sorted(built.keys() ^ held.keys())})")
        # The old modules' shards are local tensors, readable without their dead group.
        with torch.no_grad():
            for name, tensor in built.items():
                if tensor is not held[name]:
                    _local(tensor).copy_(_local(held[name]))
        replaced = {held[name]: p for name, p in module.named_parameters() if p is not held[name]}
        for optimizer in self.optimizers:
            _repoint(optimizer, replaced)
        _set_rng_states(rng)


def _tensors(module: Module) -> dict[str, Tensor]:
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def _meta_copy(modules: dict[str, Module]) -> dict[str, Module]:
    """A copy of ``modules`` whose parameters and buffers are on the meta device: no memory, no values."""
    memo: dict[int, Any] = {}
    for tensor in chain.from_iterable(chain(m.parameters(), m.buffers()) for m in modules.values()):
        meta = tensor.to("meta")
        memo[id(tensor)] = Parameter(meta, tensor.requires_grad) if isinstance(tensor, Parameter) else meta
    return copy.deepcopy(modules, memo)


def _repoint(optimizer: Optimizer, replaced: Mapping[Tensor, Tensor]) -> None:
    """Points ``optimizer`` at the parameters that replaced its own. Each keeps its state: the
    same local tensors, as DTensors on the mesh of the parameter that replaced it."""
    for group in optimizer.param_groups:
        group["params"] = [replaced.get(p, p) for p in group["params"]]
    for old, new in replaced.items():
        if old in optimizer.state:
            optimizer.state[new] = {key: _placed(value, new) for key, value in optimizer.state.pop(old).items()}


def _placed(value: Any, parameter: Tensor) -> Any:
    if not (isinstance(value, DTensor) and isinstance(parameter, DTensor)):
        return value
    return DTensor.from_local(value.to_local(), parameter.device_mesh, value.placements, run_check=False,
                              shape=value.shape, stride=value.stride())


def _is_max_limit_reached(current: int, maximum: int | None) -> bool:
    return maximum is not None and maximum != -1 and current >= maximum


def dist_backend() -> str:
    """The process group's backend when none is named: NCCL where CUDA is, gloo elsewhere."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def strategy(job: Job | None = None, *, fsdp: bool = False, timeout: timedelta = default_pg_timeout,
             **kwargs: Any) -> Migratable:
    """Attaches to the job (unless given one) and returns its strategy for ``Trainer(strategy=...)``:
    ``MonkeyTreeStrategy`` (DDP), or with ``fsdp`` ``MonkeyTreeFSDPStrategy`` (FSDP2 over all processes).

    Keyword arguments go to Lightning's ``DDPStrategy`` or ``ModelParallelStrategy``
    (``process_group_backend``: the group's backend, ``nccl`` where CUDA is available and
    ``gloo`` elsewhere; for CPU training on a GPU host name ``gloo``).
    """
    if job is None:
        job = attach(kwargs.get("process_group_backend") or dist_backend(), timeout)
    if fsdp:
        return MonkeyTreeFSDPStrategy(job, timeout=timeout, **kwargs)
    return MonkeyTreeStrategy(job, timeout=timeout, **kwargs)


__all__ = ["JobEnvironment", "Migratable", "MonkeyTreeFSDPStrategy", "MonkeyTreeStrategy", "Moved", "State",
           "strategy"]
