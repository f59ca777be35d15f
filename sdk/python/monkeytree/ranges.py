"""The staging ranges a process will save into or load from, mapped before the job stops for them.

Mapping a range and filling its page table costs about 0.04 s per 512 MiB, and unmapping it
0.02 s more: at a migration, with the job stopped, that is a third of a checkpoint's write. The
launcher names each process's ranges before ``attach`` (sdk/contract/protocol/channel.ts): its share of the
host's outbox, and in a replacement its share of the staged checkpoint. The hook maps them then,
and a save or load whose range is one of them goes through that mapping.
"""
from __future__ import annotations

import mmap
import os
from collections.abc import Mapping

from .storage import map_range

OUTBOX_ENV = "MONKEYTREE_OUTBOX"
INBOX_ENV = "MONKEYTREE_INBOX"
INBOX_OFFSET_ENV = "MONKEYTREE_INBOX_OFFSET"
SHARE_ENV = "MONKEYTREE_SHARE"

Range = tuple[str, int, int]


def expected_ranges(local_rank: int, env: Mapping[str, str] = os.environ) -> list[Range]:
    """This process's share of the outbox and, in a replacement, of its staged checkpoint, as
    ``(buffer, offset, length)``: local rank r's share is ``[base + r × share, + share)``."""
    share = env.get(SHARE_ENV, "")
    if not share.isdigit() or int(share) == 0:
        return []
    length = int(share)
    ranges = []
    if env.get(OUTBOX_ENV):
        ranges.append((env[OUTBOX_ENV], local_rank * length, length))
    base = env.get(INBOX_OFFSET_ENV, "")
    if env.get(INBOX_ENV) and base.isdigit():
        ranges.append((env[INBOX_ENV], int(base) + local_rank * length, length))
    return ranges


class Premapped:
    """Mappings of whole ranges, kept for the life of the process: the pages are the outbox's and
    the daemon's, which keep them as long as this process runs; the mappings hold only their
    page tables."""

    def __init__(self, ranges: list[Range]) -> None:
        self._views: dict[Range, memoryview] = {}
        self._mappings: list[mmap.mmap] = []
        for where in ranges:
            buffer, offset, length = where
            try:
                mapping, start = map_range(buffer, offset, length)
            except (OSError, ValueError):
                continue  # the save or load that needs it maps it then, and says what is wrong
            self._mappings.append(mapping)
            self._views[where] = memoryview(mapping).cast("B")[start:start + length]

    def view(self, buffer: str, offset: int, length: int) -> memoryview | None:
        """The mapped range, when it is exactly one of those mapped."""
        return self._views.get((buffer, offset, length))
