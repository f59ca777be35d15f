"""MonkeyTree's hook for training scripts: ``attach`` to the launcher and meet it at a ``barrier``
each iteration; a worker's state saved into and loaded from a staging buffer in the checkpoint
layout of sdk/checkpoint/FORMAT.md, through torch's DCP."""
import importlib

from ._version import __version__

# Names resolve on first use (PEP 562), so `python3 -m monkeytree --version` and the layout
# reader work without importing torch; a training script pays for torch when it touches the hook.
_EXPORTS = {
    "ChannelError": "hook",
    "Job": "hook",
    "attach": "hook",
    "CheckpointError": "layout",
    "init_optimizer_state": "state",
    "load": "state",
    "rng_state": "state",
    "save": "state",
    "set_rng_state": "state",
    "StagingReader": "storage",
    "StagingWriter": "storage",
    "open_staging_buffer": "storage",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'monkeytree' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_EXPORTS])
