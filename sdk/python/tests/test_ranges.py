"""Staging ranges by name, mapped whole or ahead of the save or load that uses them."""
import os
import uuid
from collections.abc import Iterator

import pytest
import torch

import monkeytree
from monkeytree import ranges
from monkeytree.ranges import Premapped, expected_ranges

SHARE = 1 << 16


@pytest.fixture
def buffer() -> Iterator[str]:
    """A /dev/shm buffer of three shares, as an outbox of three local processes is."""
    name = f"monkeytree-test-{uuid.uuid4().hex}"
    path = os.path.join("/dev/shm", name)
    with open(path, "wb") as file:
        file.truncate(3 * SHARE)
    yield name
    os.unlink(path)


def test_a_process_knows_its_ranges_from_its_launcher() -> None:
    env = {ranges.OUTBOX_ENV: "out", ranges.SHARE_ENV: str(SHARE)}
    assert expected_ranges(2, env) == [("out", 2 * SHARE, SHARE)]
    resuming = {**env, ranges.INBOX_ENV: "in", ranges.INBOX_OFFSET_ENV: "8192"}
    assert expected_ranges(1, resuming) == [("out", SHARE, SHARE), ("in", 8192 + SHARE, SHARE)]
    assert expected_ranges(0, {ranges.OUTBOX_ENV: "out"}) == []  # no share: a launcher that does not say
    assert expected_ranges(0, {**env, ranges.SHARE_ENV: "0"}) == []


def test_a_save_into_a_range_mapped_ahead_matches_one_by_name(buffer: str) -> None:
    state = {"x": torch.arange(1000, dtype=torch.float32), "step": torch.tensor(7)}
    premapped = Premapped([(buffer, SHARE, SHARE), ("monkeytree-test-missing", 0, SHARE)])
    # A buffer that cannot be mapped is left to the save that needs it, which says why.
    assert premapped.view("monkeytree-test-missing", 0, SHARE) is None
    assert premapped.view(buffer, 0, SHARE) is None
    view = premapped.view(buffer, SHARE, SHARE)
    assert view is not None
    assert view.nbytes == SHARE
    written = monkeytree.save(state, view)
    by_name = monkeytree.save(state, buffer, offset=2 * SHARE, length=SHARE)
    assert written == by_name
    mapped = monkeytree.open_staging_buffer(buffer)
    try:
        assert mapped[SHARE:SHARE + written] == mapped[2 * SHARE:2 * SHARE + written]
    finally:
        mapped.close()
    target = {"x": torch.zeros(1000), "step": torch.tensor(0)}
    monkeytree.load(target, buffer, offset=SHARE, length=SHARE)
    assert torch.equal(target["x"], state["x"])
    assert int(target["step"]) == 7


def test_a_range_by_name_outside_the_buffer_is_refused(buffer: str) -> None:
    outside = rf"range \[{2 * SHARE}, {4 * SHARE}\) lies outside the buffer's {3 * SHARE} bytes"
    with pytest.raises(ValueError, match=outside):
        monkeytree.save({"x": torch.zeros(4)}, buffer, offset=2 * SHARE, length=2 * SHARE)
