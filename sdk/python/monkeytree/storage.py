"""A DCP ``StorageWriter``/``StorageReader`` pair that keeps a checkpoint in a staging buffer.

The writer lays DCP's write items out as sdk/contract/checkpoint/FORMAT.md says, in the order the plan
lists them, and writes the metadata document and header in ``finish``; the reader rebuilds DCP
``Metadata`` from that document and copies each chunk straight out of the mapped buffer into the
tensor the planner resolves, checking the chunk's CRC32C first. Both speak the interface of
``torch.distributed.checkpoint`` (torch ≥ 2.6, as the package requires).

A buffer is given by name (a file in /dev/shm, as ``StagingBuffer.create`` in native/index.ts makes
it) or as any writable buffer object, optionally with ``offset`` and ``length``: the checkpoint
then occupies that range and its storage offsets count from the range's start. The checkpoint is
per process: save and load with no process group (``monkeytree.save``/``monkeytree.load`` do that),
even inside a distributed job.
"""
from __future__ import annotations

import contextlib
import io
import mmap
import os
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.metadata import TensorProperties as _TensorProperties
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem, SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .crc import copy_with_crc32c, crc32c, crc32c_tensor
from .layout import (
    DEFAULT_ALIGNMENT,
    DTYPE_BYTES,
    Blob,
    BytesItem,
    Checkpoint,
    CheckpointError,
    ChunkEntry,
    Item,
    Stored,
    TensorItem,
    Writer,
    check_alignment,
)

if TYPE_CHECKING:
    from typing_extensions import Buffer, Self

#: Where a checkpoint's blob lies, and for a tensor chunk its dtype and sizes (None for bytes).
_Location = tuple[Blob, Optional[torch.dtype], Optional[list[int]]]

_metadata = dcp.metadata
_planner = dcp.planner

SHM_DIRECTORY = "/dev/shm"


def open_staging_buffer(name: str) -> mmap.mmap:
    """Maps ``/dev/shm/<name>`` read-write, whole, as ``StagingBuffer.open`` does in TypeScript."""
    return map_range(name, 0, None)[0]


def map_range(name: str, offset: int, length: int | None) -> tuple[mmap.mmap, int]:
    """Maps the pages of ``/dev/shm/<name>`` that hold ``[offset, offset + length)`` (to its end
    when ``length`` is None), their page tables filled at once; returns the mapping and where the
    range starts in it.

    A process writes or reads only its own range of a buffer that may be many times larger (a
    host's outbox, a daemon's staging). Filled at once, its page table costs a tenth of the faults
    that a first touch of each page takes: 0.04 against 0.2 s per 512 MiB, all of it downtime.
    """
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"a staging buffer name is a file name in {SHM_DIRECTORY}, received {name!r}")
    fd = os.open(os.path.join(SHM_DIRECTORY, name), os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        end = size if length is None else offset + length
        if offset < 0 or end < offset or end > size:
            raise ValueError(f"range [{offset}, {end}) lies outside the buffer's {size} bytes")
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        # mmap maps a file's whole length when asked for none.
        return mmap.mmap(fd, max(end - start, 1), flags=flags, offset=start), offset - start
    finally:
        os.close(fd)


class _Mapped:
    """Owns the mapping when a storage object was given a name rather than a buffer, and the
    view of ``[offset, offset + length)`` when the checkpoint occupies only part of it (one range
    per local process in a shared staging buffer)."""

    def __init__(self, buffer: str | Buffer, offset: int = 0, length: int | None = None) -> None:
        whole: Buffer
        self._mapping: mmap.mmap | None
        if isinstance(buffer, str):
            self._mapping, offset = map_range(buffer, offset, length)
            whole = self._mapping
            length = len(whole) - offset if length is None else length
        else:
            whole, self._mapping = buffer, None
        self._view: memoryview | None = None
        if offset or length is not None:
            size = memoryview(whole).nbytes
            end = size if length is None else offset + length
            if offset < 0 or end < offset or end > size:
                self.close()
                raise ValueError(f"range [{offset}, {end}) lies outside the buffer's {size} bytes")
            self._view = memoryview(whole).cast("B")[offset:end]
        self.buffer: Buffer = self._view if self._view is not None else whole

    def close(self) -> None:
        # A traceback can still hold a tensor viewing the mapping (after a failed load); the view is
        # released and the mapping unmapped when that goes away instead.
        if self._view is not None:
            with contextlib.suppress(BufferError):
                self._view.release()
            self._view = None
        if self._mapping is None:
            return
        with contextlib.suppress(BufferError):
            self._mapping.close()
        self._mapping = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _raw_bytes(buffer: Buffer, offset: int, length: int) -> torch.Tensor:
    """A ``torch.uint8`` tensor aliasing ``length`` bytes of ``buffer`` at ``offset``."""
    if length == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(buffer, dtype=torch.uint8, count=length, offset=offset)


def dtype_name(dtype: torch.dtype) -> str:
    """The format's name for a torch dtype (``str(torch.float32)[6:]``)."""
    return str(dtype)[len("torch."):]


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"this torch ({torch.__version__}) has no dtype {name}", "invalid_item")
    return dtype


class StagingWriter(_Mapped, dcp.StorageWriter):
    """Writes one checkpoint into a staging buffer; ``length`` is its size once the save is done."""

    def __init__(self, buffer: str | Buffer, *, alignment: int = DEFAULT_ALIGNMENT, offset: int = 0,
                 length: int | None = None) -> None:
        _Mapped.__init__(self, buffer, offset, length)
        self.alignment = check_alignment(alignment)
        self.length: int | None = None
        self._layout: Writer | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._layout = None

    def close(self) -> None:
        self._layout = None
        super().close()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._layout = Writer(self.buffer, self.alignment)
        self.length = None

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def _writer(self) -> Writer:
        if self._layout is None:
            raise RuntimeError("StagingWriter: DCP wrote before set_up_storage_writer")
        return self._layout

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        layout = self._writer()
        results = []
        for item in plan.items:
            fqn = item.index.fqn
            data = planner.resolve_data(item)
            stored: Stored | ChunkEntry
            if isinstance(data, io.BytesIO):
                payload = data.getbuffer()
                start = layout.reserve(len(payload), fqn)
                layout.buf[start:start + len(payload)] = payload
                stored = {"length": len(payload), "crc32c": crc32c(payload), "storageOffset": start}
                payload.release()
            else:
                name = dtype_name(data.dtype)
                if name not in DTYPE_BYTES:
                    raise CheckpointError(f"{fqn}: dtype {name} cannot be stored; the format has"
                                          f" {', '.join(DTYPE_BYTES)}", "invalid_item")
                source = data.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                start = layout.reserve(source.numel(), fqn)
                crc = copy_with_crc32c(_raw_bytes(self.buffer, start, source.numel()), source)
                # DCP gives every tensor write item its chunk.
                assert item.tensor_data is not None
                chunk = item.tensor_data.chunk
                stored = {"offsets": list(chunk.offsets), "sizes": list(chunk.sizes), "storageOffset": start,
                          "length": source.numel(), "crc32c": crc}
            results.append(WriteResult(index=item.index, size_in_bytes=stored["length"], storage_data=stored))
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        layout = self._writer()
        written = sorted((r for rank in results for r in rank), key=lambda r: int(r.storage_data["storageOffset"]))
        items: dict[str, Item] = {}
        tensors: dict[str, TensorItem] = {}
        for result in written:
            # What write_data stored for this item: a Stored, or a ChunkEntry for a tensor.
            fqn, stored = result.index.fqn, result.storage_data
            entry = metadata.state_dict_metadata[fqn]
            if isinstance(entry, _metadata.BytesStorageMetadata):
                items[fqn] = BytesItem(fqn=fqn, kind="bytes", storageOffset=stored["storageOffset"],
                                       length=stored["length"], crc32c=stored["crc32c"])
                continue
            tensor = tensors.get(fqn)
            if tensor is None:
                tensor = TensorItem(fqn=fqn, kind="tensor", dtype=dtype_name(entry.properties.dtype),
                                    size=list(entry.size), chunks=[])
                items[fqn] = tensors[fqn] = tensor
            tensor["chunks"].append(ChunkEntry(offsets=stored["offsets"], sizes=stored["sizes"],
                                               storageOffset=stored["storageOffset"], length=stored["length"],
                                               crc32c=stored["crc32c"]))
        self.length = layout.finish(list(items.values()))
        self._layout = None


class StagingReader(_Mapped, dcp.StorageReader):
    """Reads the checkpoint at the start of a staging buffer, verifying each blob it reads."""

    def __init__(self, buffer: str | Buffer, *, offset: int = 0, length: int | None = None) -> None:
        _Mapped.__init__(self, buffer, offset, length)
        self._checkpoint: Checkpoint | None = None
        self._verified: set[int] = set()
        self._storage: dict[MetadataIndex, _Location] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._checkpoint = None

    def close(self) -> None:
        self._checkpoint = None
        super().close()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False

    @property
    def checkpoint(self) -> Checkpoint:
        """The parsed layout (header and metadata checked; blobs are checked as they are read)."""
        if self._checkpoint is None:
            self._checkpoint = Checkpoint(self.buffer)
            self._verified = set()
        return self._checkpoint

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        checkpoint = self.checkpoint
        entries: dict[str, _metadata.STORAGE_TYPES] = {}
        storage: dict[MetadataIndex, _Location] = {}
        for fqn, item in checkpoint.items.items():
            if item["kind"] == "bytes":
                entries[fqn] = _metadata.BytesStorageMetadata()
                storage[_metadata.MetadataIndex(fqn)] = (checkpoint.blob(fqn), None, None)
                continue
            dtype = torch_dtype(item["dtype"])
            chunks = []
            for chunk, blob in zip(item["chunks"], checkpoint.chunks(fqn)):
                chunks.append(_metadata.ChunkStorageMetadata(offsets=torch.Size(chunk["offsets"]),
                                                             sizes=torch.Size(chunk["sizes"])))
                storage[_metadata.MetadataIndex(fqn, chunk["offsets"])] = (blob, dtype, chunk["sizes"])
            entries[fqn] = _metadata.TensorStorageMetadata(properties=_TensorProperties(dtype=dtype),
                                                           size=torch.Size(item["size"]), chunks=chunks)
        return _metadata.Metadata(state_dict_metadata=entries, storage_data=storage)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        # The storage_data that read_metadata made.
        self._storage = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def _stored(self, blob: Blob) -> torch.Tensor:
        raw = _raw_bytes(self.buffer, blob.offset, blob.length)
        if blob.offset not in self._verified:
            blob.check(crc32c_tensor(raw))
            self._verified.add(blob.offset)
        return raw

    def _copied_whole(self, blob: Blob, dtype: torch.dtype | None, sizes: list[int], target: torch.Tensor) -> bool:
        """Copies an unverified blob into ``target`` while checksumming it, where ``target`` takes
        the blob whole, byte for byte: one pass over the bytes instead of two. Raises on a
        mismatch, ``target`` then holding the corrupt bytes, as a failed load leaves its state."""
        whole = (blob.offset not in self._verified and target.dtype == dtype and target.is_contiguous()
                 and list(target.size()) == sizes and target.numel() * target.element_size() == blob.length > 0)
        if whole:
            raw = _raw_bytes(self.buffer, blob.offset, blob.length)
            blob.check(copy_with_crc32c(target.reshape(-1).view(torch.uint8), raw))
            self._verified.add(blob.offset)
        return whole

    def _copy_part(self, item: ReadItem, blob: Blob, dtype: torch.dtype, sizes: list[int],
                   target: torch.Tensor) -> None:
        """Copies the part of a verified blob that ``item`` reads into ``target``."""
        raw = self._stored(blob)
        source = raw.view(dtype).reshape(sizes) if blob.length else torch.empty(sizes, dtype=dtype)
        for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths)):
            source = source.narrow(dim, start, length)
        if target.size() != source.size():
            raise CheckpointError(
                f"{item.dest_index.fqn}: the checkpoint holds {list(source.size())} here but the state dict"
                f" expects {list(target.size())}", "invalid_item")
        target.copy_(source)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for item in plan.items:
            blob, dtype, sizes = self._storage[item.storage_index]
            if item.type == _planner.LoadItemType.BYTE_IO:
                self._stored(blob)
                planner.load_bytes(item, io.BytesIO(bytes(self.checkpoint.view(blob))))
                continue
            if dtype is None or sizes is None:
                raise CheckpointError(f"{item.dest_index.fqn}: the checkpoint holds a bytes item, the state dict a"
                                      " tensor", "unknown_fqn")
            target = planner.resolve_tensor(item).detach()
            # The whole blob into a matching tensor is copied while checksummed, in one pass.
            if not (list(item.lengths) == sizes and self._copied_whole(blob, dtype, sizes, target)):
                self._copy_part(item, blob, dtype, sizes, target)
            planner.commit_tensor(item, target)
        future: Future[None] = Future()
        future.set_result(None)
        return future
