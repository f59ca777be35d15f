"""CRC32C of large buffers, so checksumming a checkpoint does not dominate a migration.

The native addon's CRC32C (SSE4.2, several GB/s) is a shared library of its own,
``monkeytree_crc32c.node``, which ``monkeytree launch`` names in ``$MONKEYTREE_CRC32C_LIB`` for
the processes it starts; it is loaded with ctypes on first use, and ``copy_with_crc32c``
checksums bytes while copying them. Without it (said once on stderr), torch does the work:
the byte-at-a-time table loop in ``layout.crc32c`` runs at about 10 MB/s on CPython; this runs at
about 250 MB/s on one core with torch 2.13. The data is cut into ``2**k`` equal blocks whose CRCs
advance together, one torch gather per two bytes (a 65536-entry table), and the block CRCs are then merged pairwise.
Merging uses the linearity of the CRC register: feeding ``m`` more bytes maps a register ``s`` to
``zeros_m(s) ^ crc_of_those_bytes``, where ``zeros_m`` (the effect of ``m`` zero bytes) is a linear
map on 32 bits, built here as a GF(2) matrix and applied through four 256-entry tables.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, cast

import torch

from .layout import _TABLE
from .layout import crc32c as _crc32c_bytes

if TYPE_CHECKING:
    from typing_extensions import Buffer

# Below this many bytes the plain loop is faster than setting up the blocks.
_VECTOR_MIN = 1 << 16
_MAX_BLOCKS = 1 << 16
_MIN_BLOCK = 256


def _pair_table() -> torch.Tensor:
    # Feeding bytes (b0, b1) to register s gives pair[(s ^ b0 ^ b1 << 8) & 0xFFFF] ^ (s >> 16).
    low = torch.arange(1 << 16, dtype=torch.int64)
    table = torch.tensor(_TABLE, dtype=torch.int64)
    for _ in range(2):
        low = table[low & 0xFF] ^ (low >> 8)
    return low


_PAIR_TABLE = _pair_table()


def _apply(matrix: Sequence[int], value: int) -> int:
    """Multiplies a 32x32 GF(2) matrix, given as the images of the 32 unit vectors, by ``value``."""
    result = 0
    bit = 0
    while value:
        if value & 1:
            result ^= matrix[bit]
        value >>= 1
        bit += 1
    return result


def _square(matrix: Sequence[int]) -> list[int]:
    return [_apply(matrix, column) for column in matrix]


def _zero_byte_matrix() -> list[int]:
    # One zero byte maps the register s to table[s & 0xFF] ^ (s >> 8).
    return [_TABLE[(1 << bit) & 0xFF] ^ ((1 << bit) >> 8) for bit in range(32)]


# Building these maps costs far more than applying them, and checkpoints repeat tensor sizes.
@functools.lru_cache(maxsize=256)
def _zeros_matrix(count: int) -> tuple[int, ...]:
    """The linear map that ``count`` zero bytes apply to the register."""
    result = [1 << bit for bit in range(32)]
    power = _zero_byte_matrix()
    while count:
        if count & 1:
            result = [_apply(power, column) for column in result]
        count >>= 1
        if count:
            power = _square(power)
    return tuple(result)


@functools.lru_cache(maxsize=256)
def _span_tables(span: int) -> torch.Tensor:
    """``_zeros_matrix(span)`` as one 256-entry table per input byte."""
    matrix = _zeros_matrix(span)
    return torch.tensor([[_apply(matrix, b << (8 * lane)) for b in range(256)] for lane in range(4)],
                        dtype=torch.int64)


def _advance(states: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    shifted = tables[0][states & 0xFF]
    for lane in range(1, 4):
        shifted ^= tables[lane][(states >> (8 * lane)) & 0xFF]
    return shifted


#: Names the addon's CRC32C library; `monkeytree launch` sets it for torchrun and its processes.
LIBRARY_ENV = "MONKEYTREE_CRC32C_LIB"


class NativeLibrary(Protocol):
    """The addon's C entry points, as ``native_library`` declares them to ctypes: pointers are
    addresses, and each returns the CRC32C continued from ``crc``."""

    def monkeytree_crc32c(self, data: int, length: int, crc: int, /) -> int: ...

    def monkeytree_copy_crc32c(self, destination: int, source: int, length: int, crc: int, /) -> int: ...


@functools.cache
def native_library() -> NativeLibrary | None:
    """The addon's C entry points from ``$MONKEYTREE_CRC32C_LIB``, or None where that names nothing
    loadable: then every large checksum takes the torch path, which is said once on stderr because
    it makes a migration's checkpoint write and load several times slower."""
    path = os.environ.get(LIBRARY_ENV)
    if not path:
        _slow(f"{LIBRARY_ENV} is not set (monkeytree launch sets it to the addon's monkeytree_crc32c.node)")
        return None
    try:
        library = ctypes.CDLL(path)
        for name, arguments in (("monkeytree_crc32c", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32]),
                                ("monkeytree_copy_crc32c",
                                 [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32])):
            function = getattr(library, name)
            function.argtypes = arguments
            function.restype = ctypes.c_uint32
    except (OSError, AttributeError) as error:
        _slow(f"{LIBRARY_ENV}={path} cannot be loaded ({error})")
        return None
    # ctypes types foreign functions only through the argtypes and restype set above.
    return cast("NativeLibrary", library)


def _slow(why: str) -> None:
    print(f"monkeytree: {why}; checksums fall back to the torch CRC32C, about 30 times slower", file=sys.stderr)


def copy_with_crc32c(destination: torch.Tensor, source: torch.Tensor) -> int:
    """Copies 1-D uint8 CPU tensor ``source`` into ``destination`` and returns its CRC32C."""
    native = native_library()
    if native is not None and source.is_contiguous() and destination.is_contiguous():
        return native.monkeytree_copy_crc32c(destination.data_ptr(), source.data_ptr(), source.numel(), 0)
    destination.copy_(source)
    return crc32c_tensor(source)


def crc32c_tensor(data: torch.Tensor, crc: int = 0) -> int:
    """CRC32C of a 1-D ``torch.uint8`` CPU tensor, continuing from ``crc``; equals ``layout.crc32c``."""
    native = native_library()
    if native is not None and data.is_contiguous():
        return native.monkeytree_crc32c(data.data_ptr(), data.numel(), crc)
    return _crc32c_torch(data, crc)


def _crc32c_torch(data: torch.Tensor, crc: int = 0) -> int:
    total = data.numel()
    if total < _VECTOR_MIN:
        return _crc32c_bytes(bytes(data.tolist()), crc)
    blocks = min(_MAX_BLOCKS, 1 << ((total // _MIN_BLOCK).bit_length() - 1))
    block = total // blocks & ~1
    main = blocks * block
    # Row j holds the j-th little-endian 16-bit word of every block, so each step reads one
    # contiguous row; its sign extension is masked off with the index.
    rows = data[:main].view(torch.int16).view(blocks, block // 2).t().contiguous()
    states = torch.zeros(blocks, dtype=torch.int64)
    for row in rows:
        index = torch.bitwise_xor(states, row.to(torch.int64))
        index &= 0xFFFF
        states >>= 16
        states ^= _PAIR_TABLE[index]
    span = block
    while states.numel() > 1:
        states = _advance(states[0::2], _span_tables(span)) ^ states[1::2]
        span *= 2
    register = _apply(_zeros_matrix(main), crc ^ 0xFFFFFFFF) ^ int(states[0])
    return _crc32c_bytes(bytes(data[main:].tolist()), register ^ 0xFFFFFFFF)


def crc32c(buffer: Buffer) -> int:
    """CRC32C of any bytes-like object (a memoryview into a staging buffer included)."""
    view = memoryview(buffer).cast("B")
    if len(view) < _VECTOR_MIN:
        return _crc32c_bytes(view)
    return crc32c_tensor(torch.frombuffer(view, dtype=torch.uint8))
