"""sdk/contract/checkpoint/FORMAT.md as layout.py writes and reads it, with the standard library alone."""
from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from monkeytree import layout
from monkeytree.layout import HEADER, HEADER_BYTES, Checkpoint, CheckpointError, Writer, crc32c


def _write(buf: bytearray, blobs: dict[str, bytes], alignment: int = 64) -> int:
    """Lays ``blobs`` out as bytes items, as StagingWriter does for DCP's byte items."""
    writer = Writer(buf, alignment)
    items: list[layout.Item] = []
    for fqn, data in blobs.items():
        start = writer.reserve(len(data), fqn)
        writer.buf[start:start + len(data)] = data
        items.append({"fqn": fqn, "kind": "bytes", "storageOffset": start, "length": len(data), "crc32c": crc32c(data)})
    return writer.finish(items)


def _with_items(items: list[Any], data: bytes = b"") -> bytearray:
    """A checkpoint whose metadata lists ``items`` as given, valid or not, over ``data`` at offset 64."""
    buf = bytearray(4096)
    writer = Writer(buf)
    start = writer.reserve(len(data), "data")
    buf[start:start + len(data)] = data
    writer.finish(items)
    return buf


def _code(buf: bytes | bytearray) -> str:
    with pytest.raises(CheckpointError) as caught:
        Checkpoint(buf)
    return caught.value.code


def test_crc32c_matches_the_castagnoli_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    assert crc32c(b"6789", crc32c(b"12345")) == crc32c(b"123456789")


def test_round_trip_of_bytes_and_tensor_items() -> None:
    buf = bytearray(1 << 12)
    writer = Writer(buf)
    weights = struct.pack("<6f", *range(6))
    start = writer.reserve(len(weights), "w")
    buf[start:start + len(weights)] = weights
    chunk: layout.ChunkEntry = {"offsets": [0, 0], "sizes": [2, 3], "storageOffset": start, "length": len(weights),
                                "crc32c": crc32c(weights)}
    step = b"\x01\x02\x03"
    at = writer.reserve(len(step), "step")
    buf[at:at + len(step)] = step
    total = writer.finish([
        {"fqn": "w", "kind": "tensor", "dtype": "float32", "size": [2, 3], "chunks": [chunk]},
        {"fqn": "step", "kind": "bytes", "storageOffset": at, "length": len(step), "crc32c": crc32c(step)},
    ])

    checkpoint = Checkpoint(buf)
    assert checkpoint.length == total
    assert list(checkpoint.items) == ["w", "step"]
    assert bytes(checkpoint.view(checkpoint.chunks("w")[0])) == weights
    assert bytes(checkpoint.view(checkpoint.blob("step"))) == step
    assert [blob.what for blob in checkpoint.all_blobs()] == ["w chunks[0]", "step"]
    checkpoint.verify()


def test_header_fields_and_zeroed_padding() -> None:
    buf = bytearray(b"\xff" * 1024)
    total = _write(buf, {"a": b"x" * 3, "b": b"y" * 5}, alignment=128)
    magic, version, alignment, data_offset, data_length, meta_offset, meta_length, length, _, _ = \
        HEADER.unpack_from(buf, 0)
    assert (magic, version, alignment, data_offset) == (b"MTCKPT01", 1, 128, 128)
    assert meta_offset % 128 == 0
    assert meta_offset + meta_length == length == total
    assert data_offset + data_length <= meta_offset
    items = json.loads(bytes(buf[meta_offset:total]))["items"]
    assert [item["storageOffset"] for item in items] == [128, 256]
    # Everything between the header and the metadata that no blob occupies is zero.
    assert bytes(buf[HEADER_BYTES:128]) == bytes(64)
    assert bytes(buf[131:256]) == bytes(125)
    assert bytes(buf[261:meta_offset]) == bytes(meta_offset - 261)


@pytest.mark.parametrize("alignment", [8, 64, 4096])
def test_blobs_start_on_the_alignment(alignment: int) -> None:
    buf = bytearray(1 << 16)
    _write(buf, {f"b{i}": bytes(i * 7 + 1) for i in range(5)}, alignment)
    checkpoint = Checkpoint(buf)
    assert checkpoint.alignment == alignment
    assert all(blob.offset % alignment == 0 for blob in checkpoint.all_blobs())


@pytest.mark.parametrize("alignment", [0, 4, 12, 100, 63.9, "64", None])
def test_an_alignment_that_is_no_power_of_two_of_at_least_8_is_refused(alignment: object) -> None:
    with pytest.raises(ValueError, match="alignment must be a power of two of at least 8"):
        layout.check_alignment(alignment)


def test_a_buffer_too_small_for_the_header_blob_or_metadata_is_too_small() -> None:
    with pytest.raises(CheckpointError, match="less than a header") as caught:
        Writer(bytearray(32))
    assert caught.value.code == "too_small"
    with pytest.raises(CheckpointError, match=r"x: 200 bytes at offset 64 do not fit the buffer's 128 bytes") as caught:
        Writer(bytearray(128)).reserve(200, "x")
    assert caught.value.code == "too_small"
    with pytest.raises(CheckpointError, match=r"the metadata \(\d+ bytes at offset 128\) does not fit") as caught:
        _write(bytearray(140), {"x": b"1234"})
    assert caught.value.code == "too_small"


def test_header_corruption() -> None:
    buf = bytearray(1024)
    _write(buf, {"x": b"data"})
    assert _code(buf[:32]) == "bad_header"
    bad_magic = bytearray(buf)
    bad_magic[0:8] = b"NOTACKPT"
    assert _code(bad_magic) == "bad_header"
    flipped = bytearray(buf)
    flipped[20] ^= 1
    assert _code(flipped) == "checksum_mismatch"
    # A header with a valid CRC but a version or a length this reader cannot take.
    version, total = 1, 7
    for field, value in ((version, 2), (total, 4096)):
        header = bytearray(buf[:HEADER_BYTES])
        fields = list(HEADER.unpack_from(header, 0))
        fields[field] = value
        HEADER.pack_into(header, 0, *fields)
        struct.pack_into("<I", header, 60, crc32c(header[:60]))
        assert _code(header + buf[HEADER_BYTES:]) == "bad_header", field


def test_metadata_corruption() -> None:
    buf = bytearray(1024)
    total = _write(buf, {"x": b"data"})
    flipped = bytearray(buf)
    flipped[total - 2] ^= 1
    assert _code(flipped) == "checksum_mismatch"


@pytest.mark.parametrize(("items", "message"), [
    ([{"kind": "bytes"}], "every item needs a non-empty fqn"),
    ([{"fqn": "a", "kind": "bytes", "storageOffset": 64, "length": 4, "crc32c": 0}] * 2, "appears twice"),
    ([{"fqn": "a", "kind": "pickle"}], 'kind must be "tensor" or "bytes"'),
    ([{"fqn": "a", "kind": "bytes", "storageOffset": 64, "length": 4}], "a: missing 'crc32c'"),
    ([{"fqn": "a", "kind": "bytes", "storageOffset": 64, "length": -1, "crc32c": 0}], "must be unsigned integers"),
    ([{"fqn": "a", "kind": "bytes", "storageOffset": 64, "length": 4000, "crc32c": 0}], "lies outside the data region"),
    ([{"fqn": "a", "kind": "bytes", "storageOffset": 65, "length": 1, "crc32c": 0}], "is not a multiple of 64"),
    ([{"fqn": "t", "kind": "tensor", "dtype": "float7", "size": [1], "chunks": []}], "unknown dtype 'float7'"),
    ([{"fqn": "t", "kind": "tensor", "dtype": "int8", "size": [1], "chunks": []}], "at least one chunk"),
    ([{"fqn": "t", "kind": "tensor", "dtype": "int8", "size": [4],
       "chunks": [{"offsets": [0, 0], "sizes": [4], "storageOffset": 64, "length": 4, "crc32c": 0}]}],
     "rank differs"),
    ([{"fqn": "t", "kind": "tensor", "dtype": "int8", "size": [4],
       "chunks": [{"offsets": [2], "sizes": [4], "storageOffset": 64, "length": 4, "crc32c": 0}]}],
     "extends past the tensor's size"),
    ([{"fqn": "t", "kind": "tensor", "dtype": "int16", "size": [4],
       "chunks": [{"offsets": [0], "sizes": [4], "storageOffset": 64, "length": 4, "crc32c": 0}]}],
     r"length 4 does not match int16\[4\]"),
])
def test_malformed_items_are_bad_metadata(items: list[Any], message: str) -> None:
    with pytest.raises(CheckpointError, match=message) as caught:
        Checkpoint(_with_items(items, b"data"))
    assert caught.value.code == "bad_metadata"


def test_metadata_that_is_not_the_format_document_is_bad_metadata() -> None:
    for document in (b"\xff\xfe", b"[1, 2]", b'{"formatVersion": 2, "items": []}', b'{"formatVersion": 1}'):
        buf = bytearray(1024)
        _write(buf, {})
        meta_offset = HEADER.unpack_from(buf, 0)[5]
        buf[meta_offset:meta_offset + len(document)] = document
        total = meta_offset + len(document)
        header = bytearray(HEADER.pack(b"MTCKPT01", 1, 64, 64, 0, meta_offset, len(document), total,
                                       crc32c(document), 0))
        struct.pack_into("<I", header, 60, crc32c(header[:60]))
        buf[:HEADER_BYTES] = header
        assert _code(buf) == "bad_metadata", document


def test_a_changed_blob_fails_verify_naming_it_and_both_crcs() -> None:
    buf = bytearray(1024)
    _write(buf, {"a": b"first", "b": b"second"})
    checkpoint = Checkpoint(buf)
    buf[checkpoint.blob("b").offset] ^= 0x20
    with pytest.raises(CheckpointError, match=r"^b: CRC32C of bytes \[128, 134\) is 0x[0-9a-f]{8}, metadata says") \
            as caught:
        checkpoint.verify()
    assert caught.value.code == "checksum_mismatch"


def test_asking_for_a_missing_item_or_the_other_kind_is_unknown_fqn() -> None:
    buf = bytearray(1024)
    _write(buf, {"a": b"1"})
    checkpoint = Checkpoint(buf)
    with pytest.raises(CheckpointError, match="no item named 'z'") as caught:
        checkpoint.blob("z")
    assert caught.value.code == "unknown_fqn"
    with pytest.raises(CheckpointError, match="a is a bytes item, not tensor") as caught:
        checkpoint.chunks("a")
    assert caught.value.code == "unknown_fqn"
