"""MonkeyTree's hook for training scripts: ``attach`` to the launcher and meet it at a ``barrier``
each iteration; a worker's state saved into and loaded from a staging buffer in the checkpoint
layout of sdk/contract/checkpoint/FORMAT.md, through torch's DCP."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ._version import __version__ as __version__

if TYPE_CHECKING:
    # What a type checker sees of the names below, which load lazily at run time;
    # tests/test_package.py keeps the two lists equal.
    from .ahead import Place as Place
    from .ahead import expected_place as expected_place
    from .ahead import placeholder_group as placeholder_group
    from .export import ExportError as ExportError
    from .export import StagedCheckpoint as StagedCheckpoint
    from .export import export_checkpoint as export_checkpoint
    from .export import staged_ranges as staged_ranges
    from .hook import ChannelError as ChannelError
    from .hook import Job as Job
    from .hook import attach as attach
    from .hook import resuming as resuming
    from .layout import CheckpointError as CheckpointError
    from .state import init_optimizer_state as init_optimizer_state
    from .state import load as load
    from .state import rng_state as rng_state
    from .state import save as save
    from .state import set_rng_state as set_rng_state
    from .storage import StagingReader as StagingReader
    from .storage import StagingWriter as StagingWriter
    from .storage import open_staging_buffer as open_staging_buffer

# Names resolve on first use (PEP 562), so `python3 -m monkeytree --version` and the layout
# reader work without importing torch; a training script pays for torch when it touches the hook.
_EXPORTS = {
    "Place": "ahead",
    "expected_place": "ahead",
    "placeholder_group": "ahead",
    "ChannelError": "hook",
    "Job": "hook",
    "attach": "hook",
    "resuming": "hook",
    "CheckpointError": "layout",
    "init_optimizer_state": "state",
    "load": "state",
    "rng_state": "state",
    "save": "state",
    "set_rng_state": "state",
    "StagingReader": "storage",
    "StagingWriter": "storage",
    "open_staging_buffer": "storage",
    "ExportError": "export",
    "StagedCheckpoint": "export",
    "export_checkpoint": "export",
    "staged_ranges": "export",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'monkeytree' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
