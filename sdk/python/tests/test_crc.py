"""crc.py's torch CRC32C, and the addon's library when it is built, against layout.py's table loop."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from monkeytree import crc
from monkeytree.layout import crc32c as table_crc32c

_BUILT = Path(__file__).resolve().parents[3] / "native/build/Release/monkeytree_crc32c.node"

# Below the vector threshold, on it, and across a doubling of the block count.
SIZES = [0, 1, 255, crc._VECTOR_MIN - 1, crc._VECTOR_MIN, crc._VECTOR_MIN + 1, 2 * crc._VECTOR_MIN - 1,
         2 * crc._VECTOR_MIN, 2 * crc._VECTOR_MIN + 3, 300_007, 1 << 20]
# With the thresholds made small: one block, the block count doubling, the count capped with
# longer blocks, and tails of zero, one and several bytes after the last block.
SMALL_SIZES = [256, 257, 511, 512, 513, 1023, 1024, 1025, 2048 + 7, 10_001]


def _random(size: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def without_library(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(crc.LIBRARY_ENV, raising=False)
    crc.native_library.cache_clear()
    yield
    crc.native_library.cache_clear()


@pytest.mark.parametrize("size", SIZES)
def test_torch_crc32c_equals_the_table_crc32c(size: int) -> None:
    data = _random(size, size)
    expected = table_crc32c(data.numpy().tobytes())
    assert crc._crc32c_torch(data) == expected
    # Continuing from a running CRC, as a checksum of two pieces does.
    assert crc._crc32c_torch(data, 0x12345678) == table_crc32c(data.numpy().tobytes(), 0x12345678)


@pytest.mark.parametrize("size", SMALL_SIZES)
def test_torch_crc32c_equals_the_table_crc32c_at_block_boundaries(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crc, "_VECTOR_MIN", crc._MIN_BLOCK)
    monkeypatch.setattr(crc, "_MAX_BLOCKS", 4)
    data = _random(size, size)
    assert crc._crc32c_torch(data, 99) == table_crc32c(data.numpy().tobytes(), 99)


def test_crc32c_of_a_memoryview_and_a_tensor_without_the_library(without_library: None,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    data = _random(crc._VECTOR_MIN * 3 + 5, 1)
    raw = data.numpy().tobytes()
    expected = table_crc32c(raw)
    # A writable buffer, as a staging buffer's mapping is: torch warns on wrapping a read-only one.
    assert crc.crc32c(memoryview(bytearray(raw))) == expected
    assert crc.crc32c(bytearray(raw)[:100]) == table_crc32c(raw[:100])
    assert crc.crc32c_tensor(data) == expected
    copy = torch.zeros_like(data)
    assert crc.copy_with_crc32c(copy, data) == expected
    assert torch.equal(copy, data)
    # Said once, when first looked up.
    assert capsys.readouterr().err.count(f"{crc.LIBRARY_ENV} is not set") == 1


def test_a_library_that_cannot_be_loaded_is_named_and_torch_takes_over(
        without_library: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(crc.LIBRARY_ENV, "/nonexistent/monkeytree_crc32c.node")
    assert crc.native_library() is None
    assert crc.crc32c_tensor(_random(10, 2)) == table_crc32c(_random(10, 2).numpy().tobytes())
    err = capsys.readouterr().err
    assert f"{crc.LIBRARY_ENV}=/nonexistent/monkeytree_crc32c.node cannot be loaded" in err
    assert "about 30 times slower" in err


@pytest.mark.skipif(not _BUILT.is_file(), reason=f"{_BUILT} is not built (npm install builds it)")
def test_the_addon_library_equals_the_table_crc32c(without_library: None, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(crc.LIBRARY_ENV, os.fspath(_BUILT))
    assert crc.native_library() is not None
    for size in (0, 9, crc._VECTOR_MIN + 1, 1 << 20):
        data = _random(size, size)
        raw = data.numpy().tobytes()
        assert crc.crc32c_tensor(data, 77) == table_crc32c(raw, 77)
        copy = torch.empty_like(data)
        assert crc.copy_with_crc32c(copy, data) == table_crc32c(raw)
        assert torch.equal(copy, data)
    assert capsys.readouterr().err == ""
