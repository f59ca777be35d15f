"""control.py's barrier against a control block, through the addon's library when it is built."""
from __future__ import annotations

import mmap
import os
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from monkeytree import control, crc

_BUILT = Path(__file__).resolve().parents[3] / "native/build/Release/monkeytree_crc32c.node"
_NO_STOP = (1 << 53) - 1


@pytest.fixture
def block(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, mmap.mmap]]:
    if not _BUILT.exists():
        pytest.skip(f"the addon is not built ({_BUILT}); run npm install")
    monkeypatch.setenv(crc.LIBRARY_ENV, os.fspath(_BUILT))
    control._functions.cache_clear()
    name = f"monkeytree-test-{uuid.uuid4().hex}"
    path = os.path.join("/dev/shm", name)
    with open(path, "wb") as file:
        file.write(struct.pack("<qq", _NO_STOP, -1) + bytes(4096 - 16))
    with open(path, "r+b") as file:
        words = mmap.mmap(file.fileno(), 4096)
    yield name, words
    words.close()
    os.unlink(path)
    control._functions.cache_clear()


def _word(words: mmap.mmap, index: int) -> int:
    value: int = struct.unpack_from("<q", words, 8 * index)[0]
    return value


def test_passes_below_the_stop_word_and_says_where_it_is(block: tuple[str, mmap.mmap]) -> None:
    name, words = block
    cb = control.ControlBlock.open(name, 0, 8)
    assert cb is not None
    assert cb.passes(0)
    assert cb.passes(41)
    assert _word(words, 1) == 41
    struct.pack_into("<q", words, 0, 42)
    # At the stop it asks, and its word names the barrier before, which it did pass.
    assert not cb.passes(42)
    assert _word(words, 1) == 41
    struct.pack_into("<q", words, 0, 0)
    assert not cb.passes(43)


def test_refuses_words_outside_the_block(block: tuple[str, mmap.mmap]) -> None:
    name, _ = block
    with pytest.raises(ValueError, match=r"do not fit its 4096 bytes at 8-byte alignment$"):
        control.ControlBlock.open(name, 0, 4096)
    with pytest.raises(ValueError, match=r"at 8-byte alignment$"):
        control.ControlBlock.open(name, 0, 12)


def test_every_barrier_asks_without_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(crc.LIBRARY_ENV, raising=False)
    control._functions.cache_clear()
    assert control.ControlBlock.open("anything", 0, 8) is None
    control._functions.cache_clear()
