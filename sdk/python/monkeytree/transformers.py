"""MonkeyTree for the Hugging Face ``transformers.Trainer`` (DDP), written against transformers 5.24
and accelerate 1.15::

    from monkeytree.transformers import MonkeyTree

    monkeytree_callback = MonkeyTree()  # before TrainingArguments: it joins the job
    args = TrainingArguments(..., ddp_find_unused_parameters=True)
    trainer = Trainer(..., args=args, callbacks=[monkeytree_callback])
    trainer.train(resume_from_checkpoint=monkeytree_callback.resume_from_checkpoint(trainer))

Without ``monkeytree launch`` (plain torchrun) the callback forms torchrun's process group and
otherwise lets the Trainer be.

Why each part is where it is:

- ``MonkeyTree()`` attaches: accelerate forms the process group from torchrun's environment
  unless one exists, and under the launcher torchrun's is one host's alone.
- The barrier is met in ``on_step_end``, after the optimizer step and before the Trainer logs
  the step (an all-gather of the loss). A moving process saves there everything a Trainer
  checkpoint holds (model, optimizer, scheduler, ``TrainerState``, RNG) plus what the Trainer
  keeps of the step in flight: the loss not yet logged, the gradient norm and learning rate it
  is about to log, its flags.
- A replacement resumes as the Trainer resumes from a checkpoint directory, so that the
  Trainer itself skips the data already trained on and restores the RNG where it would:
  ``resume_from_checkpoint`` loads the saved state and writes ``trainer_state.json``, the
  model's weights and the RNG file into a temporary directory. ``on_train_begin`` then
  restores what no checkpoint directory carries and finishes the step in flight, logging it
  together with the processes that stayed, so that both sides run the same collectives from
  then on.
- ``"reconfigured"`` rebuilds the DDP wrapper on the new group in place: the Trainer's loop
  holds it in local variables.
- ``"stop"`` raises ``SystemExit(0)`` from ``on_step_end``: nothing after the barrier may
  communicate, and the Trainer communicates right after the callback.

Reading the Trainer's own loop (``_run_epoch``'s and ``_inner_training_loop``'s frames) is the
price of not asking the script for more lines: the values the Trainer logs after
``on_step_end`` live only there.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState
from transformers.utils import WEIGHTS_NAME

from .hook import Job, attach
from .state import from_bytes, init_optimizer_state, to_bytes

__all__ = ["MonkeyTree"]

_T = TypeVar("_T")


def _present(value: _T | None, what: str) -> _T:
    if value is None:
        raise RuntimeError(f"monkeytree.transformers: the Trainer has no {what} yet")
    return value


def _publish(job: Job) -> None:
    # accelerate's PartialState writes RANK and WORLD_SIZE back from what it read; keep whatever
    # reads them later in agreement with the job rather than with torchrun's single-host view.
    os.environ["RANK"] = str(job.rank)
    os.environ["WORLD_SIZE"] = str(job.world_size)


def _caller(name: str) -> dict[str, Any]:
    """The local variables of the Trainer method ``name`` this callback was called from."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == name and isinstance(frame.f_locals.get("self"), Trainer):
            return frame.f_locals
        frame = frame.f_back  # type: ignore[assignment]
    raise RuntimeError(f"monkeytree.transformers: not called from Trainer.{name}; the integration follows the"
                       " training loop of transformers 5.24")


def _stateful(trainer: Trainer) -> list[ExportableState]:
    # What Trainer._save_checkpoint records of the callbacks, in the handler's order.
    return [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, ExportableState)]


def _template(trainer: Trainer, optimizer: torch.optim.Optimizer) -> dict[str, object]:
    # The same keys for saving and loading; what a fresh replacement cannot shape travels as bytes.
    return {"model": _present(trainer.model, "model").state_dict(), "optimizer": optimizer.state_dict(),
            "trainer_state": b"", "lr_scheduler": b"", "rng": b"", "loop": b""}


def _rng_file(trainer: Trainer) -> tuple[str, bytes]:
    # The Trainer's own RNG file, so that a replacement's Trainer restores it where it would.
    with tempfile.TemporaryDirectory(prefix="monkeytree-rng-") as directory:
        trainer._save_rng_state(directory)
        (name,) = os.listdir(directory)
        with open(os.path.join(directory, name), "rb") as file:
            return name, file.read()


def _saved_state() -> dict[str, object]:
    """Everything a moving process holds in ``on_step_end``, where the Trainer's ``_run_epoch``
    holds the values it is about to log."""
    run = _caller("_run_epoch")
    trainer: Trainer = run["self"]
    optimizer = _present(trainer.optimizer, "optimizer")
    rng_name, rng = _rng_file(trainer)
    loop = {
        "tr_loss": trainer._tr_loss.detach().cpu(),
        "globalstep_last_logged": trainer._globalstep_last_logged,
        "total_loss_scalar": trainer._total_loss_scalar,
        "initial_global_step": trainer._initial_global_step,
        "initial_num_input_tokens_seen": trainer._initial_num_input_tokens_seen,
        "current_flos": trainer.current_flos,
        "control": trainer.control.state(),
        "callbacks": [(type(cb).__name__, cb.state()) for cb in _stateful(trainer)],
        "grad_norm": run["grad_norm"],
        "learning_rate": run["learning_rate"],
        "epoch": run["epoch"],
        "last_in_epoch": run["update_step"] == run["num_update_steps_per_epoch"] - 1,
        "steps_per_epoch": run["num_update_steps_per_epoch"],
        "rng_file": rng_name,
    }
    state = json.dumps(dataclasses.asdict(trainer.state), indent=2, sort_keys=True) + "\n"
    lr_scheduler = _present(trainer.lr_scheduler, "scheduler").state_dict()
    return {**_template(trainer, optimizer), "trainer_state": state.encode(), "lr_scheduler": to_bytes(lr_scheduler),
            "rng": rng, "loop": to_bytes(loop)}


def _rebuild(trainer: Trainer, model: torch.nn.Module) -> None:
    """Builds the DDP wrapper anew on the current process group, as accelerate built it, into the
    same object: the training loop holds it in its local variables."""
    if not isinstance(model, DistributedDataParallel):
        raise NotImplementedError(f"monkeytree.transformers re-forms DistributedDataParallel only, not"
                                  f" {type(model).__name__}")
    handler = trainer.accelerator.ddp_handler
    kwargs = handler.to_kwargs() if handler is not None else {}
    fresh = DistributedDataParallel(model.module, device_ids=model.device_ids, output_device=model.output_device,
                                    **kwargs)
    if handler is not None:
        handler.register_comm_hook(fresh)
    # The old reducer goes with the old dictionary; the hook holds the old group until the next
    # barrier, so the reducer's release does not destroy it here.
    vars(model).update(vars(fresh))


def _no_batches(epoch_iterator: object, num_batches: int, device: torch.device) -> tuple[list[Any], None]:
    """``Trainer.get_batch_samples`` for a replacement whose job stopped training at its step."""
    return [], None


class MonkeyTree(TrainerCallback):
    """Makes a ``Trainer`` DDP job migratable under ``monkeytree launch``: construct it before
    ``TrainingArguments`` (it joins the job), pass it to ``Trainer(callbacks=[...])``, and train with
    ``trainer.train(resume_from_checkpoint=callback.resume_from_checkpoint(trainer))``.

    It attaches with ``backend`` and ``timeout`` unless given the ``job`` a script attached itself;
    ``job`` is the job's rank, world size and generation.
    """

    def __init__(self, backend: str = "gloo", timeout: timedelta = timedelta(minutes=5),
                 job: Job | None = None) -> None:
        if job is None:
            if dist.is_initialized():
                raise RuntimeError("monkeytree.transformers.MonkeyTree() forms the job's process group: create it"
                                   " before TrainingArguments (whose device setup forms one from the environment)")
            job = attach(backend, timeout)
        self.job = job
        _publish(job)
        self._ready = False
        self._resumed: tuple[dict[str, Any], Mapping[str, Any]] | None = None
        self._directory: tempfile.TemporaryDirectory[str] | None = None

    def resume_from_checkpoint(self, trainer: Trainer) -> str | None:
        """What to pass ``trainer.train`` as ``resume_from_checkpoint``: None unless this process
        replaces one that moved. A replacement loads the moved process's state here (the model's
        and the optimizer's in place, the optimizer created first for it) and returns a checkpoint
        directory for the Trainer to resume from."""
        if self.job.managed and trainer.model_init is not None:
            raise NotImplementedError("monkeytree.transformers: a Trainer with model_init builds its model in train(),"
                                      " after a replacement loaded its state into it")
        self._ready = True
        if not self.job.resuming:
            return None
        optimizer = trainer.create_optimizer()
        # Adam's moments exist only after a first step; load fills them in place.
        init_optimizer_state(optimizer)
        state = self.job.load(_template(trainer, optimizer))
        loop = from_bytes(state["loop"])
        self._resumed = loop, state
        self._directory = tempfile.TemporaryDirectory(prefix="monkeytree-resume-")
        directory = self._directory.name
        with open(os.path.join(directory, TRAINER_STATE_NAME), "wb") as file:
            file.write(state["trainer_state"])
        # The Trainer will not resume without weights to load; they are the ones just loaded.
        torch.save(_present(trainer.model, "model").state_dict(), os.path.join(directory, WEIGHTS_NAME))
        with open(os.path.join(directory, loop["rng_file"]), "wb") as file:
            file.write(state["rng"])
        return directory

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> TrainerControl | None:
        if self.job.managed and not self._ready:
            raise RuntimeError("monkeytree.transformers: train with trainer.train(resume_from_checkpoint="
                               "callback.resume_from_checkpoint(trainer)), or a replacement cannot resume")
        if self._resumed is None:
            return None
        loop, saved = self._resumed
        self._resumed = None
        if state.global_step != self.job.resume_step:
            raise RuntimeError(f"monkeytree.transformers: the Trainer resumed at step {state.global_step}, the job at"
                               f" step {self.job.resume_step}")
        return self._finish_step(_caller("_inner_training_loop"), loop, saved)

    def _finish_step(self, begun: Mapping[str, Any], loop: dict[str, Any], saved: Mapping[str, Any]) -> TrainerControl:
        """Puts back what the moved process's Trainer held of its last step and does what its
        Trainer did after ``on_step_end``, as the processes that stayed do now."""
        trainer: Trainer = begun["self"]
        # After the scheduler, as the Trainer loads them: creating the scheduler set the learning rates.
        _present(trainer.lr_scheduler, "scheduler").load_state_dict(from_bytes(saved["lr_scheduler"]))
        _present(trainer.optimizer, "optimizer").load_state_dict(saved["optimizer"])
        trainer._tr_loss = loop["tr_loss"].to(trainer.args.device)
        trainer._globalstep_last_logged = loop["globalstep_last_logged"]
        trainer._total_loss_scalar = loop["total_loss_scalar"]
        trainer._initial_global_step = loop["initial_global_step"]
        trainer._initial_num_input_tokens_seen = loop["initial_num_input_tokens_seen"]
        trainer.current_flos = loop["current_flos"]
        held = list(loop["callbacks"])
        for callback in _stateful(trainer):
            index = next(i for i, (name, _) in enumerate(held) if name == type(callback).__name__)
            for key, value in held.pop(index)[1]["attributes"].items():
                setattr(callback, key, value)
        trainer.control = TrainerControl(**loop["control"]["args"])

        def log_save_evaluate() -> None:
            trainer._maybe_log_save_evaluate(trainer._tr_loss, loop["grad_norm"], begun["model"], begun["trial"],
                                             loop["epoch"], begun["ignore_keys_for_eval"], begun["start_time"],
                                             learning_rate=loop["learning_rate"])

        log_save_evaluate()
        control = trainer.control
        state = trainer.state
        # Where the Trainer's resume goes on: the epoch after the step's, or the step's from the next batch.
        next_epoch_runs = state.global_step // loop["steps_per_epoch"] < state.num_train_epochs
        if control.should_training_stop and (next_epoch_runs or not loop["last_in_epoch"]):
            # The others end the epoch and training: this Trainer runs an epoch without a batch to its end.
            vars(trainer)["get_batch_samples"] = _no_batches
        elif loop["last_in_epoch"]:
            trainer.control = trainer.callback_handler.on_epoch_end(trainer.args, state, control)
            log_save_evaluate()
        elif control.should_epoch_stop:
            raise NotImplementedError("monkeytree.transformers: a move at a step that stops its epoch early")
        return trainer.control

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        directive = self.job.barrier(state.global_step, _saved_state)
        if directive == "stop":
            raise SystemExit(0)
        if directive == "reconfigured":
            run = _caller("_run_epoch")
            trainer: Trainer = run["self"]
            if self.job.rank != trainer.args.process_index or self.job.world_size != trainer.args.world_size:
                raise RuntimeError(f"monkeytree.transformers: the re-formed group makes this process rank"
                                   f" {self.job.rank} of {self.job.world_size}; the Trainer shards data as rank"
                                   f" {trainer.args.process_index} of {trainer.args.world_size}")
            _publish(self.job)
            _rebuild(trainer, run["model"])

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        if self._directory is not None:
            self._directory.cleanup()
            self._directory = None
