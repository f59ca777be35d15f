"""Saving a worker's training state into a staging buffer and loading it back, with DCP.

A state dict may nest dicts (``{"model": model.state_dict(), "optim": optimizer.state_dict(),
"step": 41, "rng": rng_state()}``); nested keys become dotted fqns (``optim.state.0.exp_avg``).
Tensors become tensor items; a ``bytes`` value becomes a bytes item holding exactly those bytes (so other
languages can read it), any other value a bytes item holding ``torch.save`` of it.
"""
from __future__ import annotations

import io
import random
import warnings
from collections.abc import Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.planner import ReadItem, WriteItem

from .layout import CheckpointError, Item
from .storage import StagingReader, StagingWriter, dtype_name

if TYPE_CHECKING:
    from typing_extensions import Buffer

#: A training state as ``load`` fills it: nested dicts of tensors and other values.
StateDict = MutableMapping[str, Any]

_BYTE_IO = dcp.planner.WriteItemType.BYTE_IO
# The state dict reaches DCP flat already (``_flatten``); DCP would flatten it again, descending
# into lists of dicts (``param_groups``) and naming items differently from the TypeScript reader.
# Its pass over nested ShardedTensors rebuilds the dict and so drops an empty dict value (the
# ``state`` of an SGD without momentum), which load then misses; a worker's state has none.
_NO_FLATTEN = {"flatten_state_dict": False, "flatten_sharded_tensors": False}


def _flatten(state_dict: Mapping[str, object]) -> tuple[dict[str, object], dict[str, tuple[object, ...]]]:
    # Keys below the top may be other than strings (an optimizer's state is keyed by int).
    flat: dict[str, object] = {}
    paths: dict[str, tuple[object, ...]] = {}

    def visit(node: Mapping[Any, object], prefix: str, path: tuple[object, ...]) -> None:
        for key, value in node.items():
            fqn = f"{prefix}{key}"
            if isinstance(value, dict) and value:
                visit(value, f"{fqn}.", (*path, key))
                continue
            if fqn in flat:
                raise CheckpointError(f"{fqn}: two entries of the state dict flatten to this name", "duplicate_fqn")
            flat[fqn], paths[fqn] = value, (*path, key)

    visit(state_dict, "", ())
    return flat, paths


def to_bytes(value: object) -> bytes:
    """``value`` pickled by torch, as a bytes item of a state dict (saved verbatim)."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes) -> Any:
    """What ``to_bytes`` pickled. Only for state this job saved itself: unpickling runs code."""
    return torch.load(io.BytesIO(data), weights_only=False)


class _SavePlanner(DefaultSavePlanner):
    """DCP's planner, except that ``bytes`` values are stored verbatim rather than pickled."""

    def __init__(self) -> None:
        super().__init__(**_NO_FLATTEN)

    def transform_object(self, write_item: WriteItem, object: Any) -> torch.Tensor | io.BytesIO:
        if write_item.type == _BYTE_IO and isinstance(object, (bytes, bytearray)):
            return io.BytesIO(object)
        transformed: torch.Tensor | io.BytesIO = super().transform_object(write_item, object)
        return transformed


class _LoadPlanner(DefaultLoadPlanner):
    """DCP's planner, except that an entry whose template value is ``bytes`` gets the stored bytes,
    and that every non-tensor value lands in the dict DCP hands back (the default planner
    assigns it into a copy it made of the state dict)."""

    def __init__(self) -> None:
        super().__init__(**_NO_FLATTEN)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        if isinstance(self.original_state_dict.get(fqn), (bytes, bytearray)):
            self.original_state_dict[fqn] = value.getvalue()
        else:
            self.original_state_dict[fqn] = torch.load(value, weights_only=False)


_DcpFailure = dcp.api.CheckpointException
_T = TypeVar("_T")


def _run(call: Callable[..., _T], **arguments: object) -> _T:
    # A migration checkpoints one host's processes while the rest of the job keeps its state in
    # memory: every save and load is this process's alone (no_dist), never a collective.
    try:
        with warnings.catch_warnings():
            # DCP warns that it "assumes the intent" is a single process: it is.
            warnings.filterwarnings("ignore", message=".*assuming the intent is to .* in a single process")
            return call(no_dist=True, **arguments)
    except _DcpFailure as failure:
        # DCP wraps each rank's exception with its traceback; ours carry the code callers need.
        for cause, _ in failure.failures.values():
            if isinstance(cause, CheckpointError):
                raise cause from None
        raise


def save(state_dict: Mapping[str, object], buffer: str | Buffer, *, alignment: int = 64, offset: int = 0,
         length: int | None = None) -> int:
    """Writes ``state_dict`` as a checkpoint at the start of ``buffer`` (a /dev/shm name or a
    writable buffer), or of its range ``[offset, offset + length)``, and returns its length in
    bytes.

    Raises:
        CheckpointError: ``too_small`` when the buffer cannot hold it, ``invalid_item`` for a
            tensor dtype the format lacks, ``duplicate_fqn`` when two keys flatten to one name.
    """
    flat, _ = _flatten(state_dict)
    with StagingWriter(buffer, alignment=alignment, offset=offset, length=length) as writer:
        _run(dcp.save, state_dict=flat, storage_writer=writer, planner=_SavePlanner())
        assert writer.length is not None, "DCP's save returns after the writer's finish"
        return writer.length


def _check_template(flat: Mapping[str, object], items: Mapping[str, Item]) -> None:
    # DCP copies whatever region two shapes share and converts dtypes on copy; a migrated worker
    # must get back exactly what it saved, so any difference is an error here.
    missing = sorted(set(flat) - set(items))
    if missing:
        raise CheckpointError(f"the checkpoint has no item named {', '.join(missing)}", "unknown_fqn")
    for fqn, value in flat.items():
        item = items[fqn]
        if not isinstance(value, torch.Tensor):
            if item["kind"] != "bytes":
                raise CheckpointError(f"{fqn}: the checkpoint holds a tensor, the state dict a {type(value).__name__}",
                                      "unknown_fqn")
            continue
        if item["kind"] != "tensor":
            raise CheckpointError(f"{fqn}: the checkpoint holds a bytes item, the state dict a tensor", "unknown_fqn")
        expected = (dtype_name(value.dtype), list(value.shape))
        if (item["dtype"], item["size"]) != expected:
            raise CheckpointError(
                f"{fqn}: the checkpoint holds {item['dtype']}{item['size']}, the state dict"
                f" {expected[0]}{expected[1]}", "invalid_item")


def load(state_dict: StateDict, buffer: str | Buffer, *, offset: int = 0, length: int | None = None) -> None:
    """Fills ``state_dict`` from the checkpoint at the start of ``buffer`` (or of its range
    ``[offset, offset + length)``): tensors in place (they
    must already have the saved shapes), other values replaced; an entry whose value is ``bytes``
    receives the stored bytes as they are. Items of the checkpoint that the state dict lacks are
    ignored.

    Raises:
        CheckpointError: ``unknown_fqn`` when the checkpoint lacks an entry of ``state_dict`` or
            holds it as the other kind, ``invalid_item`` when a tensor's dtype or shape differs,
            ``checksum_mismatch`` when stored bytes are corrupt, ``bad_header``/``bad_metadata``
            when the buffer holds no valid checkpoint.
    """
    flat, paths = _flatten(state_dict)
    with StagingReader(buffer, offset=offset, length=length) as reader:
        _check_template(flat, reader.checkpoint.items)
        _run(dcp.load, state_dict=flat, storage_reader=reader, planner=_LoadPlanner())
    for fqn, path in paths.items():
        node: Any = state_dict
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = flat[fqn]


def rng_state() -> bytes:
    """The process's random number generator states (torch's CPU generator, every CUDA device's
    once CUDA is initialised, Python's ``random``) as one bytes value, for a state dict."""
    state: dict[str, object] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    # torch leaves is_initialized unannotated.
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    return to_bytes(state)


def set_rng_state(data: bytes) -> None:
    """Restores what ``rng_state`` captured."""
    state = from_bytes(data)
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Creates the per-parameter state a fresh optimizer lacks (Adam's moments and step) without
    changing any parameter, so ``optimizer.state_dict()`` has every tensor ``load`` fills in place.

    For Adam and AdamW it creates the state their first step would (zeros), without the step's
    arithmetic, which costs a replacement or a re-formed group about 0.5 s per 44M parameters on a
    CPU core. Any other optimizer takes one step with a learning rate of 0 and zero gradients
    where a parameter has none, then gets its learning rates and gradients back.
    """
    missing = [p for group in optimizer.param_groups for p in group["params"] if p not in optimizer.state]
    if not missing or _zero_adam_state(optimizer, missing):
        return
    rates = [group["lr"] for group in optimizer.param_groups]
    without_grad = [p for p in missing if p.grad is None]
    with torch.no_grad():
        for p in without_grad:
            p.grad = torch.zeros_like(p)
        try:
            for group in optimizer.param_groups:
                group["lr"] = 0.0
            optimizer.step()
        finally:
            for group, rate in zip(optimizer.param_groups, rates):
                group["lr"] = rate
            for p in without_grad:
                p.grad = None


def _zero_adam_state(optimizer: torch.optim.Optimizer, missing: list[torch.Tensor]) -> bool:
    """Gives ``missing`` the state torch's Adam and AdamW create at their first step; False for
    other optimizers, or settings (fused, capturable, differentiable) whose state differs."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return False
    settings = ("fused", "capturable", "differentiable")
    if any(group.get(setting) for group in optimizer.param_groups for setting in settings):
        return False
    amsgrad = {id(p): bool(group.get("amsgrad")) for group in optimizer.param_groups for p in group["params"]}
    # As torch.optim.optimizer._get_scalar_dtype chooses it for the step count.
    step_dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    for p in missing:
        state: dict[str, torch.Tensor] = {
            "step": torch.tensor(0.0, dtype=step_dtype),
            "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
        }
        if amsgrad[id(p)]:
            state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        optimizer.state[p] = state
    return True
