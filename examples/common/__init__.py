"""What the example training scripts share: a tiny GPT, its data, and the loop MonkeyTree drives."""
from .gpt import GPT, Config, batch, lm_loss
from .loop import Build, Job, Start, State, Worker, adamw, config, main, parser, run, train_step, update

__all__ = ["GPT", "Build", "Config", "Job", "Start", "State", "Worker", "adamw", "batch",
           "config", "lm_loss", "main", "parser", "run", "train_step", "update"]
