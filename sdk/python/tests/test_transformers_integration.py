"""monkeytree.transformers in this process: a Trainer trains under DDP over a process group of one
whose Job answers its barriers as the launcher would at chosen steps (save into a bytearray and
stop, or re-form the group), and a replacement resumes from what was saved. However it was moved,
the run must end with the parameters, optimizer state, schedule and logged losses of a run that
was not."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from monkeytree.hook import Job
from tests.simulated import Simulated, form_group

pytest.importorskip("transformers")
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from monkeytree.transformers import MonkeyTree, _saved_state

# transformers' advice about this tiny configuration and its deprecations against this torch.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")

EPOCH = 4  # optimizer steps per pass over the data
BATCH = 4


def _job(tmp: Path, **kwargs: Any) -> Simulated:
    """A simulated job on a group of one, formed first, as ``monkeytree.attach`` does."""
    form_group(tmp)
    return Simulated(tmp, **kwargs)


class Tokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, size: int) -> None:
        self.tokens = torch.randint(0, 64, (size, 16), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


@pytest.fixture(autouse=True)
def torchrun_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # As torchrun's one process: accelerate then wraps the model in DDP.
    for name, value in {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _train(job: Job, tmp: Path, steps: int, resume: bool = True, accumulate: int = 1) -> Trainer:
    callback = MonkeyTree(job=job)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=str(tmp / "out"), max_steps=steps, per_device_train_batch_size=BATCH,
                             learning_rate=1e-2, weight_decay=0.1, lr_scheduler_type="cosine", warmup_steps=3,
                             logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True,
                             ddp_backend="gloo", ddp_find_unused_parameters=True, seed=0,
                             gradient_accumulation_steps=accumulate)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(EPOCH * BATCH * accumulate), callbacks=[callback])
    trainer.train(resume_from_checkpoint=callback.resume_from_checkpoint(trainer) if resume else None)
    return trainer


def _outcome(trainer: Trainer) -> dict[str, Any]:
    assert trainer.model is not None
    assert trainer.optimizer is not None
    assert trainer.lr_scheduler is not None
    history = trainer.state.log_history
    return {"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict()["state"],
            "scheduler": trainer.lr_scheduler.state_dict(), "steps": [entry for entry in history if "loss" in entry],
            "train_loss": history[-1]["train_loss"], "global_step": trainer.state.global_step,
            "epoch": trainer.state.epoch}


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def _moved(tmp: Path, steps: int, stop: int, reform: int | None, accumulate: int) -> dict[str, Any]:
    mover = _job(tmp, stop=stop, reform=reform)
    with pytest.raises(SystemExit) as stopped:
        _train(mover, tmp, steps, accumulate=accumulate)
    assert stopped.value.code == 0
    assert not dist.is_initialized()
    replacement = _job(tmp, resume=(stop, mover.saved))
    return _outcome(_train(replacement, tmp, steps, accumulate=accumulate))


@pytest.mark.parametrize(("steps", "stop", "reform", "accumulate"), [
    (10, 3, 2, 1),  # mid-epoch, after the group was re-formed once
    (10, 4, None, 1),  # the last step of an epoch: the replacement begins the next
    (10, 10, None, 1),  # the last step, mid-epoch: the replacement ends training without a batch
    (8, 8, None, 1),  # the last step of the last epoch
    (6, 3, None, 2),  # two batches to an optimizer step
])
def test_a_replacement_ends_as_an_unmoved_run(tmp_path: Path, steps: int, stop: int, reform: int | None,
                                              accumulate: int) -> None:
    expected = _outcome(_train(_job(tmp_path), tmp_path, steps, accumulate=accumulate))
    dist.destroy_process_group()
    assert _equal(_moved(tmp_path, steps, stop, reform, accumulate), expected)


def test_a_re_formed_group_gets_a_rebuilt_wrapper_and_the_run_goes_on_unchanged(tmp_path: Path) -> None:
    expected = _outcome(_train(_job(tmp_path), tmp_path, 6))
    dist.destroy_process_group()
    job = _job(tmp_path, reform=3)
    trainer = _train(job, tmp_path, 6)
    assert isinstance(trainer.model_wrapped, DistributedDataParallel)
    assert trainer.model_wrapped.process_group is dist.group.WORLD
    assert trainer.model_wrapped.find_unused_parameters
    assert job.generation == 1
    assert _equal(_outcome(trainer), expected)


def test_an_unmanaged_job_trains_as_without_it(tmp_path: Path) -> None:
    form_group(tmp_path)
    trainer = _train(Job(0, 1, 0), tmp_path, 3)
    assert trainer.state.global_step == 3
    assert len([entry for entry in trainer.state.log_history if "loss" in entry]) == 3


def test_misuse_is_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"train with trainer.train\(resume_from_checkpoint="):
        _train(_job(tmp_path), tmp_path, 2, resume=False)
    with pytest.raises(RuntimeError, match="create it before TrainingArguments"):
        MonkeyTree()
    with pytest.raises(RuntimeError, match=r"not called from Trainer._run_epoch"):
        _saved_state()
