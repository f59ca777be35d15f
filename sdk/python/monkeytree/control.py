"""The launcher's control block: barriers passed without a message (sdk/contract/protocol/channel.ts).

Why it exists: almost every barrier answers ``continue``, and a message to the launcher and back
costs a wake-up of two processes. The launcher publishes the barrier its host stops at in a
64-bit word of a /dev/shm buffer; at each barrier a process writes its step to its own word and
then reads the stop word, both sequentially consistent through the addon's C library, and passes
when its step is below it. The launcher writes the stop word before it reads the processes'
words, so of a process passing a barrier and the launcher taking a stop, one always sees the
other (sdk/client/hold.ts). Without the library every barrier is a message, as before.
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import os
from typing import Protocol, cast

from .crc import LIBRARY_ENV


class _Functions(Protocol):
    def monkeytree_barrier_enter(self, slot: int, stop: int, step: int, /) -> int: ...

    def monkeytree_barrier_ask(self, slot: int, step: int, /) -> None: ...


@functools.cache
def _functions() -> _Functions | None:
    path = os.environ.get(LIBRARY_ENV)
    if not path:
        return None
    try:
        library = ctypes.CDLL(path)
        enter = library.monkeytree_barrier_enter
        enter.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        enter.restype = ctypes.c_int64
        ask = library.monkeytree_barrier_ask
        ask.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        ask.restype = None
    except (OSError, AttributeError):
        return None
    return cast("_Functions", library)


class ControlBlock:
    """This process's view of the launcher's control block: its slot and the host's stop word."""

    def __init__(self, functions: _Functions, buffer: str, stop_offset: int, slot_offset: int) -> None:
        fd = os.open(os.path.join("/dev/shm", buffer), os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        size = len(self._map)
        if max(stop_offset, slot_offset) + 8 > size or stop_offset % 8 or slot_offset % 8:
            self._map.close()
            raise ValueError(f"control block {buffer}: words at {stop_offset} and {slot_offset} do not fit its"
                             f" {size} bytes at 8-byte alignment")
        self._cells = (ctypes.c_int64.from_buffer(self._map, stop_offset),
                       ctypes.c_int64.from_buffer(self._map, slot_offset))
        self._stop, self._slot = (ctypes.addressof(cell) for cell in self._cells)
        self._enter = functions.monkeytree_barrier_enter
        self._ask = functions.monkeytree_barrier_ask

    @staticmethod
    def open(buffer: str, stop_offset: int, slot_offset: int) -> ControlBlock | None:
        """The block, or None where the addon's library is not loadable: then every barrier asks."""
        functions = _functions()
        return None if functions is None else ControlBlock(functions, buffer, stop_offset, slot_offset)

    def passes(self, step: int) -> bool:
        """Whether this process may pass barrier ``step`` without a message; if not, it must ask."""
        if step < self._enter(self._slot, self._stop, step):
            return True
        self._ask(self._slot, step)
        return False
