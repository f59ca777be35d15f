"""Staged checkpoints written out as one standard PyTorch DCP checkpoint directory.

A migration checkpoint is also an ordinary checkpoint: ``export_checkpoint`` reads one or more
checkpoints in the layout of sdk/contract/checkpoint/FORMAT.md (each a process's range of a staging
buffer, or a copy of one in a file) and writes what torch's ``FileSystemWriter`` writes for the
same state: data files ``__<i>_0.distcp`` (a tensor chunk as a ``torch.save`` archive, a bytes
item as its bytes) and ``.metadata``, a pickled ``Metadata`` whose ``_StorageInfo`` records say
where each blob lies. Plain ``dcp.load(state_dict, storage_reader=FileSystemReader(directory))``
reads it, so a moved worker's state can be inspected, or training resumed, without MonkeyTree.

How several sources merge into one checkpoint:

- Tensor chunks of one fqn from different sources become chunks of one global tensor (the FSDP
  shards of a parameter, saved by different ranks). A chunk that several sources hold with the
  same bytes (a replicated parameter, a scalar ``step``) is written once; different bytes for the
  same chunk, or chunks that overlap without matching, are an error naming the fqn.
- A bytes item must hold the same bytes in every source that has it; it is written once.
- Items whose fqn matches a per-source pattern (default: ``rng``, ``*.rng``, ``*rng_state*``) are
  per-process state such as RNG states, which no single value can stand for. With more than one
  source, each source's item is kept as ``monkeytree.source<i>.<fqn>`` (``i`` its position among
  the sources) and ``<fqn>`` holds the first source's, so a state dict saved with that key still
  loads. The result's ``per_source`` lists them.
- DCP's loader ``torch.load``s every bytes item. The hook stores a ``bytes`` value verbatim, so a
  bytes item that is not a ``torch.save`` archive is written as ``torch.save`` of those bytes,
  and ``dcp.load`` gives them back as ``bytes``; the result's ``wrapped`` lists them.

Every stored blob's CRC32C is verified before anything is written. The directory is written as a
hidden sibling and renamed into place at the end, so a failed export leaves nothing behind.
"""
from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import io
import json
import mmap
import os
import pickle
import shutil
import stat
import sys
import traceback
import uuid
import warnings
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import NoReturn, Union

import torch

# FileSystemReader unpickles these records from .metadata; torch names no public equivalent.
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from .crc import crc32c_tensor
from .layout import Blob, Checkpoint, CheckpointError, Item

BytesLike = Union[bytes, bytearray, memoryview, mmap.mmap]
#: A staging buffer's name in /dev/shm (``str``, as ``StagingReader`` takes it), a file holding a
#: copy of one (``os.PathLike``, e.g. ``pathlib.Path``), or the bytes themselves.
BufferSource = Union[str, "os.PathLike[str]", BytesLike]

SHM_DIRECTORY = "/dev/shm"
METADATA_FILE = ".metadata"
DATA_SUFFIX = ".distcp"
#: What ``FileSystemWriter`` of the torch this was written against stamps on its metadata.
DCP_VERSION = "1.0.0"
#: ``monkeytree launch`` gives each local process a page-aligned share of its staging.
PAGE = 4096
#: Per-source copies of per-process items are named ``<prefix><i>.<fqn>``.
SOURCE_PREFIX = "monkeytree.source"
DEFAULT_PER_SOURCE = ("rng", "*.rng", "*rng_state*")

# torch.save's archive (a zip holding <name>/data.pkl), or its legacy form, which starts with a
# pickled magic number.
_LEGACY_TORCH_SAVE = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)


class ExportError(Exception):
    """A source that cannot be read, or an output directory that cannot be written, as asked."""


@dataclasses.dataclass(frozen=True)
class StagedCheckpoint:
    """Where one staged checkpoint lies: it starts at ``offset`` in ``buffer`` and may use
    ``length`` bytes (default: the rest of the buffer). ``label`` names it in messages."""

    buffer: BufferSource
    offset: int = 0
    length: int | None = None
    label: str | None = None


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What ``export_checkpoint`` wrote.

    ``files``: the directory's files, data files first. ``data_bytes``: bytes of the data files.
    ``duplicates``: chunks and bytes items that several sources held identically, written once.
    ``per_source``: per-process fqn to the names each source's item was written under (the fqn
    itself holds the first source's). ``incomplete``: tensors whose chunks do not cover them
    (a load leaves the rest of such a tensor as it was). ``wrapped``: bytes items written as
    ``torch.save`` of their raw bytes.
    """

    directory: str
    files: list[str]
    sources: int
    tensors: int
    bytes_items: int
    chunks: int
    data_bytes: int
    duplicates: int
    per_source: dict[str, list[str]]
    incomplete: list[str]
    wrapped: list[str]

    @property
    def items(self) -> int:
        return self.tensors + self.bytes_items

    def to_json(self) -> dict[str, object]:
        return {"directory": self.directory, "files": self.files, "sources": self.sources, "items": self.items,
                "tensors": self.tensors, "bytesItems": self.bytes_items, "chunks": self.chunks,
                "dataBytes": self.data_bytes, "duplicates": self.duplicates, "perSource": self.per_source,
                "incomplete": self.incomplete, "wrapped": self.wrapped}


def _describe_buffer(buffer: BufferSource) -> str:
    if isinstance(buffer, str):
        return f"{SHM_DIRECTORY}/{buffer}"
    if isinstance(buffer, os.PathLike):
        return os.fspath(buffer)
    return f"a {type(buffer).__name__} of {memoryview(buffer).nbytes} bytes"


def _path_of(buffer: str | os.PathLike[str]) -> str:
    if isinstance(buffer, str):
        if not buffer or "/" in buffer or buffer in (".", ".."):
            raise ExportError(f"a staging buffer is named by a file name in {SHM_DIRECTORY}, received {buffer!r};"
                              " give a file path as a pathlib.Path (--file)")
        return os.path.join(SHM_DIRECTORY, buffer)
    return os.fspath(buffer)


def _size_of(buffer: BufferSource) -> int:
    if isinstance(buffer, (str, os.PathLike)):
        path = _path_of(buffer)
        try:
            return os.stat(path).st_size
        except OSError as error:
            raise ExportError(f"{path}: {error.strerror}") from None
    return memoryview(buffer).nbytes


def staged_ranges(buffer: BufferSource, count: int, *, offset: int = 0,
                  length: int | None = None) -> list[StagedCheckpoint]:
    """The ``count`` checkpoints of a host's local processes in one staging buffer.

    ``[offset, offset + length)`` (default: from ``offset`` to the end) is cut as ``monkeytree
    launch`` cuts its ``--checkpoint-bytes``: local rank ``r`` owns ``share`` bytes from
    ``offset + r * share``, ``share`` being ``length / count`` rounded down to a multiple of 4096.
    """
    if count < 1:
        raise ExportError(f"the number of ranges must be a whole number of at least 1, received {count!r}")
    whole = _size_of(buffer) - offset if length is None else length
    share = whole // count // PAGE * PAGE
    if share <= 0:
        raise ExportError(f"{_describe_buffer(buffer)}: {whole} bytes from offset {offset} leave less than a"
                          f" {PAGE}-byte page for each of {count} ranges")
    base = _describe_buffer(buffer)
    return [StagedCheckpoint(buffer, offset + rank * share, share, f"range {rank} of {base}") for rank in range(count)]


@contextmanager
def _opened(source: StagedCheckpoint) -> Iterator[memoryview]:
    """The source's range, read-only; a named buffer or file is mapped for the duration."""
    mapping: mmap.mmap | None = None
    if isinstance(source.buffer, (str, os.PathLike)):
        path = _path_of(source.buffer)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as error:
            hint = f"; `ls {SHM_DIRECTORY}` lists the staging buffers" if isinstance(source.buffer, str) else ""
            raise ExportError(f"{path}: {error.strerror}{hint}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ExportError(f"{path} is not a file")
            if info.st_size:
                mapping = mmap.mmap(fd, info.st_size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        whole = memoryview(mapping) if mapping is not None else memoryview(b"")
    else:
        whole = memoryview(source.buffer).cast("B")
    try:
        size = whole.nbytes
        end = size if source.length is None else source.offset + source.length
        if source.offset < 0 or end < source.offset or end > size:
            raise ExportError(f"{_describe_buffer(source.buffer)}: range [{source.offset}, {end}) lies outside its"
                              f" {size} bytes")
        with whole[source.offset:end] as view:
            yield view
    finally:
        whole.release()
        if mapping is not None:
            # A traceback may still hold a view of the mapping; it is unmapped when that goes.
            with suppress(BufferError):
                mapping.close()


def _label(source: StagedCheckpoint, index: int) -> str:
    if source.label:
        base = source.label
    elif isinstance(source.buffer, (str, os.PathLike)):
        base = _describe_buffer(source.buffer)
    else:
        base = f"source {index}"
    if source.offset == 0 and source.length is None:
        return base
    end = "end" if source.length is None else str(source.offset + source.length)
    return f"{base} [{source.offset}, {end})"


def _raw(view: memoryview) -> torch.Tensor:
    """A uint8 tensor aliasing ``view`` (read-only: nothing here writes through it)."""
    if not view.nbytes:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(view, dtype=torch.uint8)


@dataclasses.dataclass
class _Piece:
    """One stored blob chosen for the output, and the source that holds it."""

    source: int
    blob: Blob
    offsets: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()


@dataclasses.dataclass
class _Item:
    fqn: str
    kind: str
    dtype: str = ""
    size: tuple[int, ...] = ()
    pieces: list[_Piece] = dataclasses.field(default_factory=list)


class _Source:
    def __init__(self, label: str, checkpoint: Checkpoint) -> None:
        self.label = label
        self.checkpoint = checkpoint

    def raw(self, blob: Blob) -> torch.Tensor:
        return _raw(self.checkpoint.view(blob))


def _volume(sizes: Sequence[int]) -> int:
    count = 1
    for n in sizes:
        count *= n
    return count


def _overlap(a: _Piece, b: _Piece) -> bool:
    return all(oa < ob + sb and ob < oa + sa for oa, sa, ob, sb in zip(a.offsets, a.sizes, b.offsets, b.sizes))


class _Merger:
    def __init__(self, sources: list[_Source], per_source: Sequence[str]) -> None:
        self.sources = sources
        self.patterns = tuple(per_source)
        self.items: dict[str, _Item] = {}
        self.per_source: dict[str, list[str]] = {}
        self.duplicates = 0

    def run(self) -> None:
        many = len(self.sources) > 1
        for index, source in enumerate(self.sources):
            for fqn in source.checkpoint.items:
                if many and any(fnmatch.fnmatchcase(fqn, pattern) for pattern in self.patterns):
                    if fqn not in self.items:
                        self._add_whole(fqn, fqn, index)
                    name = f"{SOURCE_PREFIX}{index}.{fqn}"
                    self.per_source.setdefault(fqn, []).append(name)
                    self._add_whole(name, fqn, index)
                else:
                    self._merge(fqn, index)

    def _new(self, name: str, meta: Item, index: int) -> _Item:
        if name in self.items:
            raise CheckpointError(f"{name}: {self.sources[index].label} holds an item of this name, and the export"
                                  f" names a per-source copy the same; rename one of them", "duplicate_fqn")
        if meta["kind"] == "bytes":
            item = _Item(name, "bytes")
        else:
            item = _Item(name, "tensor", meta["dtype"], tuple(meta["size"]))
        self.items[name] = item
        return item

    def _pieces(self, fqn: str, index: int) -> list[_Piece]:
        checkpoint = self.sources[index].checkpoint
        meta = checkpoint.items[fqn]
        if meta["kind"] == "bytes":
            return [_Piece(index, checkpoint.blob(fqn))]
        return [_Piece(index, blob, tuple(chunk["offsets"]), tuple(chunk["sizes"]))
                for chunk, blob in zip(meta["chunks"], checkpoint.chunks(fqn))]

    def _add_whole(self, name: str, fqn: str, index: int) -> None:
        item = self._new(name, self.sources[index].checkpoint.items[fqn], index)
        item.pieces.extend(self._pieces(fqn, index))

    def _merge(self, fqn: str, index: int) -> None:
        meta = self.sources[index].checkpoint.items[fqn]
        label = self.sources[index].label
        item = self.items.get(fqn)
        if item is None:
            item = self._new(fqn, meta, index)
        elif item.kind != meta["kind"]:
            first = self.sources[item.pieces[0].source].label
            raise CheckpointError(f"{fqn}: {first} holds a {item.kind} item, {label} a {meta['kind']} item",
                                  "invalid_item")
        elif meta["kind"] == "tensor" and (item.dtype, list(item.size)) != (meta["dtype"], meta["size"]):
            first = self.sources[item.pieces[0].source].label
            raise CheckpointError(f"{fqn}: {first} holds {item.dtype}{list(item.size)}, {label}"
                                  f" {meta['dtype']}{meta['size']}", "invalid_item")
        for piece in self._pieces(fqn, index):
            self._add_piece(item, piece)

    def _same(self, a: _Piece, b: _Piece) -> bool:
        if a.blob.length != b.blob.length or a.blob.crc32c != b.blob.crc32c:
            return False
        return torch.equal(self.sources[a.source].raw(a.blob), self.sources[b.source].raw(b.blob))

    def _add_piece(self, item: _Item, piece: _Piece) -> None:
        label = self.sources[piece.source].label
        for held in item.pieces:
            if item.kind == "bytes" or (held.offsets, held.sizes) == (piece.offsets, piece.sizes):
                if held.source != piece.source and self._same(held, piece):
                    self.duplicates += 1
                    return
                first = self.sources[held.source].label
                what = "bytes" if item.kind == "bytes" else \
                    f"chunk at offsets {list(piece.offsets)} of sizes {list(piece.sizes)}"
                hint = (f"; if it is per-process state, export it per source (per_source pattern, --per-source"
                        f" {item.fqn})") if held.source != piece.source else ""
                raise CheckpointError(f"{item.fqn}: {first} and {label} hold different {what}{hint}", "duplicate_fqn")
            if _overlap(held, piece):
                first = self.sources[held.source].label
                raise CheckpointError(
                    f"{item.fqn}: the chunk at offsets {list(piece.offsets)} of sizes {list(piece.sizes)} in {label}"
                    f" overlaps the one at offsets {list(held.offsets)} of sizes {list(held.sizes)} in {first}",
                    "invalid_item")
        item.pieces.append(piece)


def _is_torch_save(data: memoryview) -> bool:
    if bytes(data[:len(_LEGACY_TORCH_SAVE)]) == _LEGACY_TORCH_SAVE:
        return True
    if bytes(data[:4]) != b"PK\x03\x04":
        return False
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return any(name == "data.pkl" or name.endswith("/data.pkl") for name in archive.namelist())
    except (zipfile.BadZipFile, ValueError):
        return False


def _tensor(raw: torch.Tensor, dtype: torch.dtype, sizes: Sequence[int]) -> torch.Tensor:
    if not raw.numel():
        return torch.empty(list(sizes), dtype=dtype)
    # A copy with storage of exactly its own bytes, as FileSystemWriter saves (torch.save
    # writes a tensor's whole storage).
    return raw.view(dtype).reshape(list(sizes)).clone()


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"this torch ({torch.__version__}) has no dtype {name}", "invalid_item")
    return dtype


def _write(merger: _Merger, directory: Path, checkpoint_id: Path) -> tuple[list[str], int, list[str]]:
    """Writes the data files and .metadata into ``directory``; returns the data files, their bytes
    and the wrapped bytes items."""
    per_file: dict[int, list[tuple[_Item, int, _Piece]]] = {}
    for item in merger.items.values():
        for position, piece in enumerate(item.pieces):
            per_file.setdefault(piece.source, []).append((item, position, piece))
    entries: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
    for item in merger.items.values():
        if item.kind == "bytes":
            entries[item.fqn] = BytesStorageMetadata()
        else:
            chunks = [ChunkStorageMetadata(offsets=torch.Size(p.offsets), sizes=torch.Size(p.sizes))
                      for p in item.pieces]
            entries[item.fqn] = TensorStorageMetadata(properties=TensorProperties(dtype=_dtype(item.dtype)),
                                                      size=torch.Size(item.size), chunks=chunks)
    storage: dict[MetadataIndex, _StorageInfo] = {}
    files: list[str] = []
    wrapped: list[str] = []
    total = 0
    for index in sorted(per_file):
        name = f"__{index}_0{DATA_SUFFIX}"
        source = merger.sources[index]
        # FileSystemWriter writes a file's bytes items before its tensors.
        ordered = sorted(per_file[index], key=lambda entry: entry[0].kind != "bytes")
        with open(directory / name, "wb") as stream:
            for item, position, piece in ordered:
                start = stream.tell()
                view = source.checkpoint.view(piece.blob)
                if item.kind == "bytes":
                    if _is_torch_save(view):
                        stream.write(view)
                    else:
                        wrapped.append(item.fqn)
                        torch.save(bytes(view), stream)
                    key = MetadataIndex(item.fqn)
                else:
                    torch.save(_tensor(source.raw(piece.blob), _dtype(item.dtype), piece.sizes), stream)
                    key = MetadataIndex(item.fqn, piece.offsets, position)
                storage[key] = _StorageInfo(name, start, stream.tell() - start)
            total += stream.tell()
            stream.flush()
            os.fsync(stream.fileno())
        files.append(name)
    metadata = Metadata(state_dict_metadata=entries, planner_data={fqn: (fqn,) for fqn in entries},
                        storage_data=storage,
                        storage_meta=StorageMeta(checkpoint_id=checkpoint_id, save_id=str(uuid.uuid4())),
                        version=DCP_VERSION)
    with open(directory / METADATA_FILE, "wb") as stream:
        pickle.dump(metadata, stream)
        stream.flush()
        os.fsync(stream.fileno())
    return files, total, wrapped


def _check_target(target: Path, overwrite: bool) -> bool:
    """Whether ``target`` holds something that the export replaces."""
    if not target.exists():
        return False
    if not target.is_dir():
        raise ExportError(f"{target} exists and is not a directory; give a new or empty directory")
    if not any(target.iterdir()):
        return False
    if not overwrite:
        raise ExportError(f"{target} exists and is not empty; give a new or empty directory, or overwrite it"
                          " (overwrite=True, --overwrite)")
    return True


def _sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _place(staging: Path, target: Path, replace: bool) -> None:
    """Renames the finished ``staging`` directory to ``target``; an existing one is moved aside
    first and removed once the new one is in place."""
    if not replace:
        try:
            # rename(2) replaces an empty directory and fails on anything else.
            os.rename(staging, target)
        except OSError as error:
            raise ExportError(f"{target}: cannot put the checkpoint there ({error.strerror}); give a new or empty"
                              " directory") from None
        return
    aside = target.parent / f".{target.name}.{uuid.uuid4().hex[:12]}.replaced"
    os.rename(target, aside)
    try:
        os.rename(staging, target)
    except OSError:
        os.rename(aside, target)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def export_checkpoint(sources: Iterable[StagedCheckpoint | BufferSource], directory: str | os.PathLike[str], *,
                      overwrite: bool = False, per_source: Sequence[str] = DEFAULT_PER_SOURCE) -> ExportResult:
    """Writes the staged checkpoints ``sources`` as one DCP checkpoint directory that
    ``torch.distributed.checkpoint.load`` reads with ``FileSystemReader(directory)``.

    A source is a ``StagedCheckpoint`` (a buffer with a range; ``staged_ranges`` gives a host's
    per-process ranges), or a buffer whose checkpoint starts at byte 0: a staging buffer's name in
    /dev/shm (``str``), a file holding a copy of one (``os.PathLike``), or bytes. ``directory``
    must be new or empty unless ``overwrite``; its missing parents are created. ``per_source``:
    shell patterns of the fqns that hold per-process state (see the module's description).

    Raises:
        ExportError: a source cannot be read, a range lies outside its buffer, or ``directory``
            holds something and ``overwrite`` is false.
        CheckpointError: a source is no valid checkpoint (``bad_header``, ``bad_metadata``), a
            blob's CRC32C is wrong (``checksum_mismatch``), or the sources disagree on an item
            (``duplicate_fqn``, ``invalid_item``); the message names the source and the fqn.
    """
    given = [s if isinstance(s, StagedCheckpoint) else StagedCheckpoint(s) for s in sources]
    patterns = (per_source,) if isinstance(per_source, str) else tuple(per_source)
    if not given:
        raise ExportError("no staged checkpoint to export; give at least one source")
    target = Path(directory)
    replace = _check_target(target, overwrite)
    with ExitStack() as stack, warnings.catch_warnings():
        # The sources are mapped read-only; torch.frombuffer warns about that, and nothing writes.
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        opened = []
        for index, source in enumerate(given):
            label = _label(source, index)
            view = stack.enter_context(_opened(source))
            try:
                checkpoint = Checkpoint(view)
                stack.callback(checkpoint.buf.release)
                for blob in checkpoint.all_blobs():
                    blob.check(crc32c_tensor(_raw(checkpoint.view(blob))))
            except CheckpointError as error:
                raise CheckpointError(f"{label}: {error}", error.code) from None
            opened.append(_Source(label, checkpoint))
        merger = _Merger(opened, patterns)
        merger.run()
        staging = target.parent / f".{target.name}.{uuid.uuid4().hex[:12]}.partial"
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(staging)
        except OSError as error:
            raise ExportError(f"{target}: cannot create it ({error.strerror}); give a directory this user can"
                              " write") from None
        try:
            files, data_bytes, wrapped = _write(merger, staging, target)
            _sync_directory(staging)
            _place(staging, target, replace)
        except OSError as error:
            shutil.rmtree(staging, ignore_errors=True)
            raise ExportError(f"{target}: writing the checkpoint failed ({error.strerror or error})") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _sync_directory(target.parent)
    tensors = [item for item in merger.items.values() if item.kind == "tensor"]
    incomplete = [item.fqn for item in tensors
                  if sum(_volume(p.sizes) for p in item.pieces) < _volume(item.size)]
    return ExportResult(
        directory=str(target), files=[*files, METADATA_FILE], sources=len(given), tensors=len(tensors),
        bytes_items=len(merger.items) - len(tensors), chunks=sum(len(item.pieces) for item in tensors),
        data_bytes=data_bytes, duplicates=merger.duplicates, per_source=merger.per_source,
        incomplete=incomplete, wrapped=wrapped)


PROG = "python3 -m monkeytree export"

HELP = f"""usage: {PROG} (--buffer NAME | --file PATH)... [--offset BYTES] [--length BYTES]
           [--ranges N] --out DIR [--overwrite] [--per-source PATTERN]... [--json]

Writes staged MonkeyTree checkpoints (sdk/contract/checkpoint/FORMAT.md) as one standard PyTorch DCP
checkpoint directory, which torch.distributed.checkpoint.load reads with FileSystemReader(DIR)
without MonkeyTree. Every blob's CRC32C is verified first. Tensor chunks of one fqn from several
sources (FSDP shards saved by different ranks) become one tensor; items that several sources
hold identically are written once, and differing ones are an error, except per-process items
(--per-source): with several sources, each source's is kept as {SOURCE_PREFIX}<i>.<fqn> and
<fqn> holds the first source's. DIR is written beside itself and renamed into place at the end.

options:
  --buffer NAME         a staging buffer, /dev/shm/NAME
  --file PATH           a file holding a copy of a staging buffer
                        (--buffer and --file repeat; sources count from 0 in the order given)
  --offset BYTES        where the checkpoint (with --ranges, the first range) starts in each
                        source (default 0)
  --length BYTES        bytes from --offset that the checkpoint(s) may use (default: the rest)
  --ranges N            each source holds N local processes' checkpoints, one per page-aligned
                        share of --length bytes, as `monkeytree launch --checkpoint-bytes` splits
                        its staging (default 1)
  --out DIR             the directory to write: new or empty, unless --overwrite (required)
  --overwrite           replace DIR when it holds something
  --per-source PATTERN  fqns (shell patterns) of per-process state, besides {", ".join(DEFAULT_PER_SOURCE)}
  --json                print the result as one JSON object
  -h, --help            show this help

exit codes: 0 written, 2 bad usage or input (a source that is missing or holds no valid
checkpoint, a corrupt blob, sources that disagree, DIR not empty), 3 internal error.
"""


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _whole(low: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw, 10)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"must be a whole number of at least {low}, got {raw!r}")
        return value
    return parse


def _parser() -> _Parser:
    parser = _Parser(prog=PROG, add_help=False, allow_abbrev=False)
    parser.add_argument("--buffer", dest="sources", action="append", type=lambda name: ("buffer", name))
    parser.add_argument("--file", dest="sources", action="append", type=lambda path: ("file", path))
    parser.add_argument("--offset", type=_whole(0), default=0)
    parser.add_argument("--length", type=_whole(1))
    parser.add_argument("--ranges", type=_whole(1), default=1)
    parser.add_argument("--out")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--per-source", dest="per_source", action="append", default=[])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("-h", "--help", action="store_true")
    return parser


def _count(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def _summary(result: ExportResult) -> str:
    lines = [(f"wrote {result.directory}: {result.items} items ({result.tensors} tensors in {result.chunks} chunks,"
              f" {result.bytes_items} bytes items) from {_count(result.sources, 'staged checkpoint')},"
              f" {_count(result.data_bytes, 'byte')} in {_count(len(result.files) - 1, 'data file')}")]
    if result.duplicates:
        lines.append(f"identical in several sources, written once: {result.duplicates} chunks or bytes items")
    if result.per_source:
        lines.append(f"per source ({SOURCE_PREFIX}<i>.<fqn>; <fqn> holds source 0's):"
                     f" {', '.join(result.per_source)}")
    if result.incomplete:
        lines.append(f"not covered whole by the sources (a load leaves the rest as it was):"
                     f" {', '.join(result.incomplete)}")
    if result.wrapped:
        lines.append(f"raw bytes items, stored as torch.save of the bytes: {', '.join(result.wrapped)}")
    lines.append(f"load it with torch.distributed.checkpoint.load(state_dict,"
                 f" storage_reader=FileSystemReader({result.directory!r}))")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``python3 -m monkeytree export ...``; returns the exit code."""
    try:
        args = _parser().parse_args(argv)
        if args.help:
            print(HELP, end="")
            return 0
        if not args.sources:
            raise _UsageError("give the staged checkpoints with --buffer NAME (/dev/shm/NAME) or --file PATH")
        if args.out is None:
            raise _UsageError("--out DIR is required: the DCP checkpoint directory to write")
    except _UsageError as error:
        print(f"{PROG}: {error}; see --help", file=sys.stderr)
        return 2
    try:
        sources: list[StagedCheckpoint] = []
        for kind, value in args.sources:
            buffer: BufferSource = value if kind == "buffer" else Path(value)
            if args.ranges > 1:
                sources.extend(staged_ranges(buffer, args.ranges, offset=args.offset, length=args.length))
            else:
                sources.append(StagedCheckpoint(buffer, args.offset, args.length))
        result = export_checkpoint(sources, args.out, overwrite=args.overwrite,
                                   per_source=(*DEFAULT_PER_SOURCE, *args.per_source))
    except (ExportError, CheckpointError) as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        traceback.print_exc()
        print(f"{PROG}: internal error: {type(error).__name__}: {error}", file=sys.stderr)
        return 3
    print(json.dumps(result.to_json()) if args.json else _summary(result))
    return 0
