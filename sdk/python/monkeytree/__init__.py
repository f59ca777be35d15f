"""MonkeyTree's hook for training scripts: ``attach`` to the launcher and meet it at a ``barrier``
each iteration; a worker's state saved into and loaded from a staging buffer in the checkpoint
layout of sdk/checkpoint/FORMAT.md, through torch's DCP."""
from ._version import __version__
from .hook import ChannelError, Job, attach
from .layout import CheckpointError
from .state import init_optimizer_state, load, rng_state, save, set_rng_state
from .storage import StagingReader, StagingWriter, open_staging_buffer

__all__ = [
    "ChannelError",
    "CheckpointError",
    "Job",
    "StagingReader",
    "StagingWriter",
    "attach",
    "init_optimizer_state",
    "load",
    "open_staging_buffer",
    "rng_state",
    "save",
    "set_rng_state",
]
