"""Shims that let torch 1.13 (Debian's ``python3-torch``) run on Python 3.11.

torch 1.13 predates Python 3.11 support; two of the places it breaks matter to the hook and the
launcher. Each shim does nothing where it is not needed (torch ≥ 2.0, or Python < 3.11).
"""
import copy
import dataclasses
import importlib
import sys

import torch


def torch_version():
    return tuple(int(part) for part in torch.__version__.split(".")[:2])


def _needed():
    return sys.version_info >= (3, 11) and torch_version() < (2, 0)


def _lenient_dataclass(original):
    """A ``dataclass`` decorator that turns an unhashable ``field(default=...)`` into a factory."""

    def wrap(klass, **options):
        for value in vars(klass).values():
            if isinstance(value, dataclasses.Field) and value.default is not dataclasses.MISSING \
                    and type(value.default).__hash__ is None:
                default = value.default
                value.default = dataclasses.MISSING
                value.default_factory = lambda default=default: copy.copy(default)
        return original(klass, **options)

    def dataclass(cls=None, /, **options):
        return (lambda klass: wrap(klass, **options)) if cls is None else wrap(cls, **options)

    return dataclass


def import_shard_checkpoint():
    """Imports and returns ``torch.distributed._shard.checkpoint`` (torch 1.13's DCP).

    Without the shim the import fails on Python 3.11 with ``ValueError: mutable default <class
    'TensorProperties'> for field tensor_properties is not allowed: use default_factory``: 1.13's
    ``ShardedTensorMetadata`` declares ``field(default=TensorProperties())``, and Python 3.11
    rejects any default whose class is unhashable, which an ``eq=True`` dataclass is. The shim
    swaps in a ``dataclass`` that turns such a default into a factory (each instance gets its own
    copy instead of one shared object) while that one module is first imported.
    """
    name = "torch.distributed._shard.sharded_tensor.metadata"
    if _needed() and name not in sys.modules:
        original = dataclasses.dataclass
        dataclasses.dataclass = _lenient_dataclass(original)
        try:
            importlib.import_module(name)
        finally:
            dataclasses.dataclass = original
    return importlib.import_module("torch.distributed._shard.checkpoint")


def patch_torchrun_std():
    """Makes ``Std.from_str`` (torchrun's ``--redirects``/``--tee`` parser) work on Python 3.11.

    Without it ``torchrun`` (``python -m torch.distributed.run``) fails before starting any worker
    with ``AttributeError: 'NoneType' object has no attribute 'get'`` in ``to_map``: 1.13 finds a
    value's member by iterating ``Std``, and Python 3.11 no longer yields the zero flag ``NONE``
    nor the alias ``ALL``, so the default ``"0"`` (and ``"3"``) parse to ``None``. Call this in the
    process that runs torchrun's ``main`` before it parses arguments.
    """
    from torch.distributed.elastic.multiprocessing import api

    std = api.Std
    if not _needed() or getattr(std.from_str, "_monkeytree", False):
        return

    def from_str(cls, value):
        parsed = original(value)
        if isinstance(parsed, dict):
            return {int(rank): std(int(v)) for rank, v in (m.split(":") for m in value.split(","))}
        return std(int(value))

    original = std.from_str
    from_str._monkeytree = True
    std.from_str = classmethod(from_str)
