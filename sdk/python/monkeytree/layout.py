"""The checkpoint layout of sdk/contract/checkpoint/FORMAT.md (version 1), read and written in place in a
writable buffer (an ``mmap`` of a staging buffer, a ``bytearray``): header, aligned item storage,
metadata JSON, a CRC32C per stored blob. This module needs only the standard library; torch
enters in ``crc`` and ``storage``.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, TypedDict, Union

if TYPE_CHECKING:
    from typing_extensions import Buffer

MAGIC = b"MTCKPT01"
FORMAT_VERSION = 1
HEADER_BYTES = 64
DEFAULT_ALIGNMENT = 64
HEADER = struct.Struct("<8sIIQQQQQII")
_HEADER_CRC_AT = 60

#: Element sizes, keyed by the name PyTorch prints after ``torch.``.
DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "complex64": 8, "complex128": 16,
}

ErrorCode = Literal["invalid_item", "duplicate_fqn", "too_small", "bad_header", "bad_metadata", "checksum_mismatch",
                    "unknown_fqn"]


class Stored(TypedDict):
    """Where FORMAT.md puts a blob: its storage range and CRC32C."""

    storageOffset: int
    length: int
    crc32c: int


class ChunkEntry(Stored):
    """One stored chunk of a tensor item: its place in the tensor, and its blob."""

    offsets: list[int]
    sizes: list[int]


class BytesItem(Stored):
    fqn: str
    kind: Literal["bytes"]


class TensorItem(TypedDict):
    fqn: str
    kind: Literal["tensor"]
    dtype: str
    size: list[int]
    chunks: list[ChunkEntry]


#: An entry of the metadata's ``items`` list.
Item = Union[BytesItem, TensorItem]


class CheckpointError(Exception):
    """A checkpoint that cannot be written or read as asked.

    ``code`` is one of the TypeScript reader's codes (sdk/contract/checkpoint/errors.ts): ``invalid_item``,
    ``duplicate_fqn``, ``too_small``, ``bad_header``, ``bad_metadata``, ``checksum_mismatch``,
    ``unknown_fqn``.
    """

    def __init__(self, message: str, code: ErrorCode) -> None:
        super().__init__(message)
        self.code: ErrorCode = code


def _make_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return tuple(table)


_TABLE = _make_table()


def crc32c(data: Buffer, crc: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data`` (any bytes-like object), continuing from ``crc``.

    A byte-at-a-time table loop: about 10 MB/s on CPython, fine for metadata and small blobs.
    The storage layer checksums tensors with a vectorised torch version (``monkeytree.crc``);
    both give the same value.
    """
    table = _TABLE
    crc ^= 0xFFFFFFFF
    for byte in memoryview(data).cast("B"):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def check_alignment(alignment: object) -> int:
    if not isinstance(alignment, int) or alignment < 8 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two of at least 8, received {alignment!r}")
    return alignment


class Writer:
    """Lays blobs out one after another in ``buf``, then the metadata and the header.

    Call ``reserve`` for each blob in metadata order, fill the returned range, and report its
    checksum in the metadata handed to ``finish``. Padding is zeroed as the format asks.
    """

    def __init__(self, buf: Buffer, alignment: int = DEFAULT_ALIGNMENT) -> None:
        self.buf = memoryview(buf).cast("B")
        self.alignment = check_alignment(alignment)
        self.data_offset = align(HEADER_BYTES, alignment)
        self.cursor = self.data_offset
        if self.data_offset > len(self.buf):
            raise CheckpointError(f"the buffer holds {len(self.buf)} bytes, less than a header", "too_small")

    def reserve(self, length: int, what: str) -> int:
        """Returns the storage offset of the next ``length``-byte blob, zeroing the gap before it."""
        start = align(self.cursor, self.alignment)
        if start + length > len(self.buf):
            raise CheckpointError(
                f"{what}: {length} bytes at offset {start} do not fit the buffer's {len(self.buf)} bytes;"
                " create a larger staging buffer", "too_small")
        self.buf[self.cursor:start] = bytes(start - self.cursor)
        self.cursor = start + length
        return start

    def finish(self, items: list[Item]) -> int:
        """Writes the metadata document for ``items`` (FORMAT.md's item objects) and the header.

        Returns the checkpoint's total length in bytes.
        """
        meta_offset = align(self.cursor, self.alignment)
        document = json.dumps({"formatVersion": FORMAT_VERSION, "items": items},
                              separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        total = meta_offset + len(document)
        if total > len(self.buf):
            raise CheckpointError(
                f"the metadata ({len(document)} bytes at offset {meta_offset}) does not fit the buffer's"
                f" {len(self.buf)} bytes; create a larger staging buffer", "too_small")
        self.buf[self.cursor:meta_offset] = bytes(meta_offset - self.cursor)
        self.buf[meta_offset:total] = document
        header = bytearray(HEADER.pack(
            MAGIC, FORMAT_VERSION, self.alignment, self.data_offset, self.cursor - self.data_offset,
            meta_offset, len(document), total, crc32c(document), 0))
        struct.pack_into("<I", header, _HEADER_CRC_AT, crc32c(header[:_HEADER_CRC_AT]))
        self.buf[HEADER_BYTES:self.data_offset] = bytes(self.data_offset - HEADER_BYTES)
        # The header goes last so a reader never sees a valid header over half-written data.
        self.buf[0:HEADER_BYTES] = header
        return total


def _stored(entry: Any, what: str, data_start: int, data_end: int, alignment: int) -> Blob:
    try:
        start, length, crc = entry["storageOffset"], entry["length"], entry["crc32c"]
    except (KeyError, TypeError) as missing:
        raise CheckpointError(f"{what}: missing {missing}", "bad_metadata") from None
    if not all(isinstance(v, int) and v >= 0 for v in (start, length, crc)) or crc > 0xFFFFFFFF:
        raise CheckpointError(f"{what}: storageOffset, length and crc32c must be unsigned integers", "bad_metadata")
    if start < data_start or start + length > data_end:
        raise CheckpointError(
            f"{what}: storage [{start}, {start + length}) lies outside the data region"
            f" [{data_start}, {data_end})", "bad_metadata")
    if start % alignment:
        raise CheckpointError(f"{what}: storageOffset {start} is not a multiple of {alignment}", "bad_metadata")
    return Blob(what, start, length, crc)


class Blob:
    """Where one stored blob lives and the checksum the metadata promises for it."""

    __slots__ = ("crc32c", "length", "offset", "what")

    def __init__(self, what: str, offset: int, length: int, crc: int) -> None:
        self.what, self.offset, self.length, self.crc32c = what, offset, length, crc

    def check(self, actual: int) -> None:
        if actual != self.crc32c:
            raise CheckpointError(
                f"{self.what}: CRC32C of bytes [{self.offset}, {self.offset + self.length}) is"
                f" 0x{actual:08x}, metadata says 0x{self.crc32c:08x}; the checkpoint is corrupt",
                "checksum_mismatch")


class Checkpoint:
    """A checkpoint read from the start of ``buf``: its header and metadata checked, items indexed.

    ``items`` maps fqn to the metadata object; ``blob(fqn)`` (bytes items) and ``chunks(fqn)``
    (tensor items) give ``Blob`` positions; ``view(blob)`` a zero-copy memoryview of its bytes.
    Item checksums are not verified here; call ``verify`` or check each blob as it is read.
    """

    def __init__(self, buf: Buffer) -> None:
        self.buf = memoryview(buf).cast("B")
        if len(self.buf) < HEADER_BYTES:
            raise CheckpointError(f"source holds {len(self.buf)} bytes, less than the 64-byte header", "bad_header")
        (magic, version, alignment, data_offset, data_length, meta_offset, meta_length, total,
         meta_crc, head_crc) = HEADER.unpack_from(self.buf, 0)
        if magic != MAGIC:
            raise CheckpointError(f"not a MonkeyTree checkpoint: magic {magic!r}, expected {MAGIC!r}", "bad_header")
        actual = crc32c(self.buf[:_HEADER_CRC_AT])
        if actual != head_crc:
            raise CheckpointError(f"header CRC32C is 0x{actual:08x}, header says 0x{head_crc:08x}", "checksum_mismatch")
        if version != FORMAT_VERSION:
            raise CheckpointError(
                f"format version {version} is not supported; this reader reads version {FORMAT_VERSION}", "bad_header")
        if total > len(self.buf) or meta_offset + meta_length != total or data_offset + data_length > meta_offset:
            raise CheckpointError(
                f"header claims {total} bytes (metadata at {meta_offset}+{meta_length}) but the source holds"
                f" {len(self.buf)}", "bad_header")
        document = self.buf[meta_offset:total]
        actual = crc32c(document)
        if actual != meta_crc:
            raise CheckpointError(f"metadata CRC32C is 0x{actual:08x}, header says 0x{meta_crc:08x}",
                                  "checksum_mismatch")
        try:
            metadata = json.loads(bytes(document).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as cause:
            raise CheckpointError(f"metadata is not UTF-8 JSON: {cause}", "bad_metadata") from None
        if not isinstance(metadata, dict) or metadata.get("formatVersion") != FORMAT_VERSION \
                or not isinstance(metadata.get("items"), list):
            raise CheckpointError("metadata must be an object with formatVersion 1 and an items list", "bad_metadata")
        self.alignment: int = alignment
        self.length: int = total
        # Parsed from JSON and checked below to have FORMAT.md's shape.
        self.items: dict[str, Item] = {}
        self._bytes: dict[str, Blob] = {}
        self._chunks: dict[str, list[Blob]] = {}
        data_end = data_offset + data_length
        for item in metadata["items"]:
            fqn = item.get("fqn") if isinstance(item, dict) else None
            if not isinstance(fqn, str) or not fqn:
                raise CheckpointError("every item needs a non-empty fqn", "bad_metadata")
            if fqn in self.items:
                raise CheckpointError(f"{fqn}: fqn appears twice in the metadata", "bad_metadata")
            if item.get("kind") == "bytes":
                self._bytes[fqn] = _stored(item, fqn, data_offset, data_end, alignment)
            elif item.get("kind") == "tensor":
                self._chunks[fqn] = self._tensor_chunks(item, data_offset, data_end)
            else:
                raise CheckpointError(f"{fqn}: kind must be \"tensor\" or \"bytes\", received {item.get('kind')!r}",
                                      "bad_metadata")
            self.items[fqn] = item

    def _tensor_chunks(self, item: Any, data_start: int, data_end: int) -> list[Blob]:
        fqn, dtype, size = item["fqn"], item.get("dtype"), item.get("size")
        if dtype not in DTYPE_BYTES:
            raise CheckpointError(f"{fqn}: unknown dtype {dtype!r}", "bad_metadata")
        if not isinstance(size, list) or not isinstance(item.get("chunks"), list) or not item["chunks"]:
            raise CheckpointError(f"{fqn}: a tensor needs a size list and at least one chunk", "bad_metadata")
        blobs = []
        for index, chunk in enumerate(item["chunks"]):
            what = f"{fqn} chunks[{index}]"
            sizes, offsets = chunk.get("sizes"), chunk.get("offsets")
            if not isinstance(sizes, list) or not isinstance(offsets, list) \
                    or len(sizes) != len(size) or len(offsets) != len(size):
                raise CheckpointError(f"{what}: rank differs from the tensor's size", "bad_metadata")
            if any(o + s > n for o, s, n in zip(offsets, sizes, size)):
                raise CheckpointError(f"{what}: extends past the tensor's size {size}", "bad_metadata")
            blob = _stored(chunk, what, data_start, data_end, self.alignment)
            count = DTYPE_BYTES[dtype]
            for n in sizes:
                count *= n
            if count != blob.length:
                raise CheckpointError(f"{what}: length {blob.length} does not match {dtype}{sizes}", "bad_metadata")
            blobs.append(blob)
        return blobs

    def _find(self, fqn: str, kind: Literal["bytes", "tensor"]) -> None:
        item = self.items.get(fqn)
        if item is None:
            raise CheckpointError(f"no item named {fqn!r} in this checkpoint", "unknown_fqn")
        if item["kind"] != kind:
            raise CheckpointError(f"{fqn} is a {item['kind']} item, not {kind}", "unknown_fqn")

    def blob(self, fqn: str) -> Blob:
        self._find(fqn, "bytes")
        return self._bytes[fqn]

    def chunks(self, fqn: str) -> list[Blob]:
        self._find(fqn, "tensor")
        return self._chunks[fqn]

    def view(self, blob: Blob) -> memoryview:
        return self.buf[blob.offset:blob.offset + blob.length]

    def all_blobs(self) -> Iterator[Blob]:
        for fqn, item in self.items.items():
            if item["kind"] == "tensor":
                yield from self._chunks[fqn]
            else:
                yield self._bytes[fqn]

    def verify(self, checksum: Callable[[memoryview], int] = crc32c) -> None:
        """Checks every stored blob's CRC32C, raising ``CheckpointError`` at the first mismatch."""
        for blob in self.all_blobs():
            blob.check(checksum(self.view(blob)))
