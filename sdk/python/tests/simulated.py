"""A managed job of one process whose launcher is simulated in the test: the framework
integrations' tests train in this process and move or re-form it at chosen barriers."""
from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from pathlib import Path

import torch.distributed as dist

import monkeytree
from monkeytree.hook import Directive, Job, _leave_groups, _left_groups
from monkeytree.state import StateDict

_stores = itertools.count()


def form_group(tmp: Path) -> None:
    """A gloo process group of one, on a store of its own (a re-formed group needs a fresh one)."""
    store = dist.FileStore(str(tmp / f"store{next(_stores)}"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)


class Simulated(Job):
    """At ``stop`` it saves the state into ``saved`` and leaves the group, as a moving process
    does; at ``reform`` it forms the group anew; a replacement (``resume``: the step and the
    bytes saved) loads from those bytes. ``record``, when given, sees the state at every barrier."""

    def __init__(self, tmp: Path, stop: int | None = None, reform: int | None = None,
                 resume: tuple[int, bytearray] | None = None,
                 record: Callable[[int, Mapping[str, object]], None] | None = None) -> None:
        super().__init__(0, 1, 0, managed=True, resume=None if resume is None else
                         {"buffer": "simulated", "offset": 0, "length": len(resume[1]), "step": resume[0]})
        self.tmp, self.stop, self.reform, self.record = tmp, stop, reform, record
        self.source = None if resume is None else resume[1]
        self.saved = bytearray(8 << 20)

    def load(self, template: StateDict) -> StateDict:
        assert self.source is not None, "not a replacement"
        monkeytree.load(template, self.source)
        return template

    def barrier(self, step: int, state_fn: Callable[[], Mapping[str, object]]) -> Directive:
        _left_groups.clear()
        # Taken once, as a launcher takes it: a framework's save hooks run once per barrier.
        state = state_fn() if self.record is not None or step == self.stop else None
        if self.record is not None and state is not None:
            self.record(step, state)
        if step == self.stop and state is not None:
            monkeytree.save(state, self.saved)
            _leave_groups()
            return "stop"
        if step == self.reform:
            _leave_groups()
            form_group(self.tmp)
            self.generation += 1
            return "reconfigured"
        return "continue"
