"""A tiny GPT-2 trained by the Hugging Face Trainer with DistributedDataParallel, which MonkeyTree can
move between hosts while it runs.

Plain (no MonkeyTree):
    torchrun --standalone --nproc-per-node 4 examples/transformers/train.py --steps 20 --out /tmp/run.json
Managed, on each host:
    monkeytree launch --job J --host H --dp N -- torchrun --nproc-per-node 2 examples/transformers/train.py ...

The Trainer does the training; MonkeyTree comes in through one callback and the checkpoint the
Trainer resumes from. Rank 0 writes the final step, the loss the Trainer logged at every step and
a SHA-256 of all parameters and optimizer state to --out, the same bit for bit whether or not the
run was migrated or its group re-formed.
"""
import argparse
import gc
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from monkeytree.transformers import MonkeyTree

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common.state import digest

SEQUENCE = 32
VOCAB = 256
BATCH = 8


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """Synthetic token streams drawn from the seed alone: each a random walk over the vocabulary,
    so that there is something to learn."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, VOCAB, (size, 1), generator=generator)
        steps = torch.randint(-2, 3, (size, SEQUENCE - 1), generator=generator)
        self.tokens = torch.cat([starts, steps], dim=1).cumsum(dim=1).remainder(VOCAB)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_argument("--steps", type=int, default=20)
    options.add_argument("--seed", type=int, default=0)
    options.add_argument("--width", type=int, default=64, help="model width (n_embd; two attention heads)")
    options.add_argument("--layers", type=int, default=2, help="transformer blocks (n_layer)")
    options.add_argument("--epoch-steps", type=int, default=30, help="optimizer steps per pass over the data")
    options.add_argument("--out", help="JSON file rank 0 writes at the end: step, worldSize, generation, the SHA-256"
                                       " of all parameters and optimizer state, and the loss logged at each step")
    args = options.parse_args()

    # Joins the job first: TrainingArguments sets up torch.distributed from the environment
    # unless a process group exists, and under MonkeyTree the group spans hosts.
    monkeytree_callback = MonkeyTree()
    job = monkeytree_callback.job
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQUENCE, n_embd=args.width, n_layer=args.layers,
                                       n_head=2, bos_token_id=0, eos_token_id=0))
    with tempfile.TemporaryDirectory() as output_dir:
        training = TrainingArguments(
            output_dir=output_dir, max_steps=args.steps, per_device_train_batch_size=BATCH, learning_rate=3e-3,
            weight_decay=0.1, lr_scheduler_type="cosine", warmup_steps=10, logging_steps=1, save_strategy="no",
            report_to="none", disable_tqdm=True, use_cpu=True, ddp_backend="gloo", seed=args.seed,
            # There are no unused parameters, but looking for them keeps DDP's gradient buckets as
            # first laid out (see examples/ddp/train.py): the wrapper rebuilt after a re-formed group
            # then sums gradients in the order the unmigrated run does.
            ddp_find_unused_parameters=True)
        data = Tokens(args.epoch_steps * BATCH * job.world_size, args.seed)
        trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=[monkeytree_callback])
        trainer.train(resume_from_checkpoint=monkeytree_callback.resume_from_checkpoint(trainer))

        result = digest(trainer.model, trainer.optimizer)  # every rank takes part
        if job.rank == 0 and args.out:
            losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
            # Written aside and renamed: whoever waits for the file never reads half of it.
            with open(args.out + ".tmp", "w") as out:
                json.dump({"step": trainer.state.global_step, "worldSize": job.world_size,
                           "generation": job.generation, "digest": result, "losses": losses}, out)
            os.replace(args.out + ".tmp", args.out)
    # Released before the group: a DDP reducer left holding it would destroy it with the GIL held
    # (examples/common/loop.py says why that deadlocks).
    del trainer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
