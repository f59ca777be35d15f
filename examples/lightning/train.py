"""A tiny GPT trained by PyTorch Lightning with DDP, or FSDP2 over all ranks (--fsdp), which MonkeyTree
can move between hosts while it runs.

Plain (no MonkeyTree):
    torchrun --standalone --nproc-per-node 2 examples/lightning/train.py --steps 20 --out /tmp/run.json
Managed, on each host:
    monkeytree launch --job J --host H --dp N -- torchrun --nproc-per-node 2 examples/lightning/train.py ...

The only MonkeyTree line is the Trainer's strategy=monkeytree.lightning.strategy(fsdp=...). With
--fsdp, configure_model shards the GPT (each block, then the rest) over Lightning's data-parallel
mesh, and each rank holds, and moves, only its own shards. The data is a fixed set of token streams
that Lightning shards over the ranks with a shuffling DistributedSampler, a few optimizer steps per
epoch; dropout draws from torch's generator every step and a StepLR schedule changes the learning
rate, so a moved process must carry the loader's position, its random state and the scheduler's.
Rank 0 writes the final step, world size, generation, the SHA-256 of all parameters and optimizer
state and the loss Lightning logged for every batch (rank 0's) to --out, the same whether or not
the run was migrated or its group re-formed.
"""
import argparse
import dataclasses
import gc
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Dataset

import monkeytree.lightning

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import GPT, Config, adamw, batch, config, lm_loss, parser
from common.state import digest


class Streams(Dataset):
    """Token stream i: a function of (seed, i) alone."""

    def __init__(self, shape: Config, seed: int, size: int) -> None:
        self.one, self.seed, self.size = dataclasses.replace(shape, rows=1), seed, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = batch(self.one, self.seed, i, 0)
        return inputs[0], targets[0]


class TinyGPT(pl.LightningModule):
    def __init__(self, shape: Config, seed: int, dropout: float, fsdp: bool) -> None:
        super().__init__()
        self.gpt = GPT(shape, seed)
        self.dropout = dropout
        self.fsdp = fsdp

    def configure_model(self) -> None:
        if self.fsdp:
            mesh = self.device_mesh["data_parallel"]
            for block in self.gpt.blocks.values():
                fully_shard(block, mesh=mesh)
            fully_shard(self.gpt, mesh=mesh)

    def training_step(self, streams: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        inputs, targets = streams
        loss = lm_loss(F.dropout(self.gpt(inputs), self.dropout, self.training), targets)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = adamw(self.gpt)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=25, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class Losses(pl.Callback):
    """The loss Lightning logged for each training batch, kept in the callback's checkpointed state."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        self.losses.append(trainer.callback_metrics["loss"].item())

    def state_dict(self) -> dict[str, Any]:
        return {"losses": self.losses}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.losses = state_dict["losses"]


def main(args: argparse.Namespace) -> None:
    pl.seed_everything(args.seed, verbose=False)
    shape = config(args)
    losses = Losses()
    trainer = pl.Trainer(strategy=monkeytree.lightning.strategy(fsdp=args.fsdp), accelerator="cpu",
                         max_steps=args.steps, accumulate_grad_batches=args.accumulate, callbacks=[losses],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=os.environ.get("TMPDIR", "/tmp"))
    model = TinyGPT(shape, args.seed, args.dropout, args.fsdp)
    data = Streams(shape, args.seed, args.streams)
    trainer.fit(model, DataLoader(data, batch_size=shape.rows, shuffle=True))
    result = digest(model, trainer.optimizers[0])  # every rank takes part
    if trainer.global_rank == 0 and args.out:
        with open(args.out + ".tmp", "w") as out:
            json.dump({"step": trainer.global_step, "worldSize": trainer.world_size,
                       "generation": trainer.strategy.job.generation, "digest": result, "losses": losses.losses}, out)
        os.replace(args.out + ".tmp", args.out)
    # Freed before the group, as examples/common/loop.py's run frees its worker: FSDP's modules and
    # hooks refer to each other, so only the collector frees them, and left to the interpreter's
    # exit they take the group down there with its threads running, which aborts the process.
    del trainer, model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    options = parser(__doc__)
    options.add_argument("--streams", type=int, default=256, help="token streams in the data set (an epoch)")
    options.add_argument("--dropout", type=float, default=0.1, help="dropout on the logits")
    options.add_argument("--accumulate", type=int, default=1, help="batches per optimizer step")
    options.add_argument("--fsdp", action="store_true", help="FSDP2 over all ranks rather than DDP")
    # Lightning's advice for a data loader without workers, and for a run of fewer batches than its logging interval.
    warnings.filterwarnings("ignore", message=".*(does not have many workers|smaller than the logging interval).*")
    # The logits are a view; FSDP2 warns that an in-place op on them would skip its backward hook, and
    # the loss reads them out of place.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    main(options.parse_args())
