"""A DCP ``StorageWriter``/``StorageReader`` pair that keeps a checkpoint in a staging buffer.

The writer lays DCP's write items out as sdk/checkpoint/FORMAT.md says, in the order the plan
lists them, and writes the metadata document and header in ``finish``; the reader rebuilds DCP
``Metadata`` from that document and copies each chunk straight out of the mapped buffer into the
tensor the planner resolves, checking the chunk's CRC32C first. Both speak the interface of
``torch.distributed.checkpoint`` (torch ≥ 2.4).

A buffer is given by name (a file in /dev/shm, as ``StagingBuffer.create`` in native/index.ts makes
it) or as any writable buffer object, optionally with ``offset`` and ``length``: the checkpoint
then occupies that range and its storage offsets count from the range's start. The checkpoint is per process: save and load with no process
group (``monkeytree.save``/``monkeytree.load`` do that), even inside a distributed job.
"""
import io
import mmap
import os

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorProperties as _TensorProperties
from torch.futures import Future

from .crc import copy_with_crc32c, crc32c, crc32c_tensor
from .layout import DEFAULT_ALIGNMENT, DTYPE_BYTES, Checkpoint, CheckpointError, Writer, check_alignment

_metadata = dcp.metadata
_planner = dcp.planner

SHM_DIRECTORY = "/dev/shm"


def open_staging_buffer(name):
    """Maps ``/dev/shm/<name>`` read-write, whole, as ``StagingBuffer.open`` does in TypeScript."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"a staging buffer name is a file name in {SHM_DIRECTORY}, received {name!r}")
    fd = os.open(os.path.join(SHM_DIRECTORY, name), os.O_RDWR)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


class _Mapped:
    """Owns the mapping when a storage object was given a name rather than a buffer, and the
    view of ``[offset, offset + length)`` when the checkpoint occupies only part of it (one range
    per local process in a shared staging buffer)."""

    def __init__(self, buffer, offset=0, length=None):
        self._mapping = open_staging_buffer(buffer) if isinstance(buffer, str) else None
        whole = self._mapping if self._mapping is not None else buffer
        self._view = None
        if offset or length is not None:
            size = memoryview(whole).nbytes
            end = size if length is None else offset + length
            if offset < 0 or end < offset or end > size:
                self.close()
                raise ValueError(f"range [{offset}, {end}) lies outside the buffer's {size} bytes")
            self._view = memoryview(whole).cast("B")[offset:end]
        self.buffer = self._view if self._view is not None else whole

    def close(self):
        if self._view is not None:
            try:
                self._view.release()
            except BufferError:
                pass
            self._view = None
        if self._mapping is None:
            return
        try:
            self._mapping.close()
        except BufferError:
            # A traceback can still hold a tensor viewing the mapping (after a failed load); the
            # mapping is unmapped when that goes away instead.
            pass
        self._mapping = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _raw_bytes(buffer, offset, length):
    """A ``torch.uint8`` tensor aliasing ``length`` bytes of ``buffer`` at ``offset``."""
    if length == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(buffer, dtype=torch.uint8, count=length, offset=offset)


def dtype_name(dtype):
    """The format's name for a torch dtype (``str(torch.float32)[6:]``)."""
    return str(dtype)[len("torch."):]


def torch_dtype(name):
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"this torch ({torch.__version__}) has no dtype {name}", "invalid_item")
    return dtype


class StagingWriter(_Mapped, dcp.StorageWriter):
    """Writes one checkpoint into a staging buffer; ``length`` is its size once the save is done."""

    def __init__(self, buffer, *, alignment=DEFAULT_ALIGNMENT, offset=0, length=None):
        _Mapped.__init__(self, buffer, offset, length)
        self.alignment = check_alignment(alignment)
        self.length = None
        self._layout = None

    def reset(self, checkpoint_id=None):
        self._layout = None

    def close(self):
        self._layout = None
        super().close()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return False

    def set_up_storage_writer(self, is_coordinator):
        self._layout = Writer(self.buffer, self.alignment)
        self.length = None

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def write_data(self, plan, planner):
        results = []
        for item in plan.items:
            fqn = item.index.fqn
            data = planner.resolve_data(item)
            if item.type == _planner.WriteItemType.BYTE_IO:
                payload = data.getbuffer()
                start = self._layout.reserve(len(payload), fqn)
                self._layout.buf[start:start + len(payload)] = payload
                stored = {"length": len(payload), "crc32c": crc32c(payload)}
                payload.release()
            else:
                name = dtype_name(data.dtype)
                if name not in DTYPE_BYTES:
                    raise CheckpointError(
                        f"{fqn}: dtype {name} cannot be stored; the format has {', '.join(DTYPE_BYTES)}", "invalid_item")
                source = data.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                start = self._layout.reserve(source.numel(), fqn)
                crc = copy_with_crc32c(_raw_bytes(self.buffer, start, source.numel()), source)
                chunk = item.tensor_data.chunk
                stored = {"length": source.numel(), "crc32c": crc,
                          "offsets": list(chunk.offsets), "sizes": list(chunk.sizes)}
            stored["storageOffset"] = start
            results.append(dcp.storage.WriteResult(index=item.index, size_in_bytes=stored["length"],
                                                   storage_data=stored))
        future = Future()
        future.set_result(results)
        return future

    def finish(self, metadata, results):
        written = sorted((r for rank in results for r in rank), key=lambda r: r.storage_data["storageOffset"])
        items = {}
        for result in written:
            fqn, stored = result.index.fqn, dict(result.storage_data)
            place = {key: stored.pop(key) for key in ("storageOffset", "length", "crc32c")}
            entry = metadata.state_dict_metadata[fqn]
            if isinstance(entry, _metadata.BytesStorageMetadata):
                items[fqn] = {"fqn": fqn, "kind": "bytes", **place}
            else:
                item = items.setdefault(fqn, {"fqn": fqn, "kind": "tensor", "dtype": dtype_name(entry.properties.dtype),
                                              "size": list(entry.size), "chunks": []})
                item["chunks"].append({**stored, **place})
        self.length = self._layout.finish(list(items.values()))
        self._layout = None


class StagingReader(_Mapped, dcp.StorageReader):
    """Reads the checkpoint at the start of a staging buffer, verifying each blob it reads."""

    def __init__(self, buffer, *, offset=0, length=None):
        _Mapped.__init__(self, buffer, offset, length)
        self._checkpoint = None
        self._verified = set()

    def reset(self, checkpoint_id=None):
        self._checkpoint = None

    def close(self):
        self._checkpoint = None
        super().close()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return False

    @property
    def checkpoint(self):
        """The parsed layout (header and metadata checked; blobs are checked as they are read)."""
        if self._checkpoint is None:
            self._checkpoint = Checkpoint(self.buffer)
            self._verified = set()
        return self._checkpoint

    def read_metadata(self):
        checkpoint = self.checkpoint
        entries, storage = {}, {}
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

    def set_up_storage_reader(self, metadata, is_coordinator):
        self._storage = metadata.storage_data

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def _stored(self, blob):
        raw = _raw_bytes(self.buffer, blob.offset, blob.length)
        if blob.offset not in self._verified:
            blob.check(crc32c_tensor(raw))
            self._verified.add(blob.offset)
        return raw

    def read_data(self, plan, planner):
        for item in plan.items:
            blob, dtype, sizes = self._storage[item.storage_index]
            raw = self._stored(blob)
            if item.type == _planner.LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(bytes(self.checkpoint.view(blob))))
                continue
            source = raw.view(dtype).reshape(sizes) if blob.length else torch.empty(sizes, dtype=dtype)
            for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths)):
                source = source.narrow(dim, start, length)
            target = planner.resolve_tensor(item).detach()
            if target.size() != source.size():
                raise CheckpointError(
                    f"{item.dest_index.fqn}: the checkpoint holds {list(source.size())} here but the state dict"
                    f" expects {list(target.size())}", "invalid_item")
            target.copy_(source)
            planner.commit_tensor(item, target)
        future = Future()
        future.set_result(None)
        return future
