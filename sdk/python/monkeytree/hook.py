"""The training process's side of the local channel to ``monkeytree launch`` (sdk/contract/protocol/channel.ts).

Why it exists: MonkeyTree moves workers between hosts while a job runs, so the job-wide process
group cannot be torchrun's. The launcher starts torchrun per host as a single-node job (its
RANK/WORLD_SIZE are local) and hands each process the job-wide rank, world size and rendezvous
address over the channel; the hook forms the group from those, and forms it again whenever the
controller changes the job's shape.

Why a barrier per iteration: right after the optimizer step no collective is in flight and the
state is exactly model + optimizer + step + RNG, so that is the only point where a process can be
checkpointed, moved, or have its group re-formed without the script knowing how. Almost every
barrier answers ``continue``; that path is one short line each way over a blocking Unix socket,
so a script can afford it every step.

Without ``$MONKEYTREE_CHANNEL`` the script runs as a plain torchrun job and every barrier
continues, so one script serves both.
"""
from __future__ import annotations

import atexit
import importlib
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Literal, TypedDict

import torch.distributed as dist

from .control import ControlBlock
from .crc import native_library
from .ranges import Premapped, expected_ranges
from .state import StateDict
from .state import load as _load
from .state import save as _save

CHANNEL_VERSION = 1
CHANNEL_ENV = "MONKEYTREE_CHANNEL"
RESUMING_ENV = "MONKEYTREE_RESUMING"
_MAX_LINE = 1 << 20


class ChannelError(Exception):
    """The launcher answered with an ``error`` message, broke the protocol, or went away."""


#: A message as it arrives: a JSON object whose fields are checked where they are used.
Message = dict[str, Any]
Directive = Literal["continue", "reconfigured", "stop"]


class _Group(TypedDict):
    rank: int
    world_size: int
    addr: str
    port: int
    generation: int


class _Resume(TypedDict):
    buffer: str
    offset: int
    length: int
    step: int


def _whole(message: Mapping[str, object], what: str, field: str, low: int = 0, high: int | None = None) -> int:
    value = message.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ChannelError(f"{what}: {field} must be an integer {bound}, received {value!r}")
    return value


def _text(message: Mapping[str, object], what: str, field: str) -> str:
    value = message.get(field)
    if not isinstance(value, str) or not value:
        raise ChannelError(f"{what}: {field} must be a non-empty string, received {value!r}")
    return value


def _exact(message: object, what: str, fields: tuple[str, ...]) -> None:
    if not isinstance(message, dict):
        raise ChannelError(f"{what} must be a JSON object, received {message!r}")
    extra = sorted(set(message) - set(fields))
    missing = sorted(set(fields) - set(message))
    if extra or missing:
        raise ChannelError(f"{what}: missing fields {missing}, unknown fields {extra}; the launcher and"
                           f" this hook speak different versions of sdk/contract/protocol/channel.ts")


_GROUP = ("rank", "worldSize", "masterAddr", "masterPort", "generation")


def _group(message: Mapping[str, object], what: str) -> _Group:
    rank = _whole(message, what, "rank")
    world = _whole(message, what, "worldSize", 1)
    if rank >= world:
        raise ChannelError(f"{what}: rank {rank} is not below worldSize {world}")
    return {"rank": rank, "world_size": world, "addr": _text(message, what, "masterAddr"),
            "port": _whole(message, what, "masterPort", 1, 65535), "generation": _whole(message, what, "generation")}


def _buffer(message: Mapping[str, object], what: str) -> str:
    buffer = _text(message, what, "buffer")
    if "/" in buffer or buffer in (".", ".."):
        raise ChannelError(f"{what}: buffer must be a file name in /dev/shm, received {buffer!r}")
    return buffer


def _range(message: Mapping[str, object], what: str, extra: tuple[str, ...] = ()) -> tuple[str, int, int]:
    _exact(message, what, ("buffer", "offset", "length", *extra))
    return _buffer(message, what), _whole(message, what, "offset"), _whole(message, what, "length")


def _control(message: object) -> ControlBlock | None:
    what = "attached message: control"
    if message is None:
        return None
    _exact(message, what, ("buffer", "stopOffset", "slotOffset"))
    assert isinstance(message, dict)
    try:
        return ControlBlock.open(_buffer(message, what), _whole(message, what, "stopOffset"),
                                 _whole(message, what, "slotOffset"))
    except (OSError, ValueError) as cause:
        raise ChannelError(f"{what}: {cause}") from None


class _Channel:
    """One process's connection: requests out as lines, exactly one reply line per request."""

    def __init__(self, path: str, local_rank: int) -> None:
        self.path = path
        self.local_rank = local_rank
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._socket.connect(path)
        except OSError as cause:
            self._socket.close()
            raise ChannelError(f"cannot connect to the launcher's channel {CHANNEL_ENV}={path}: {cause};"
                               " start the script under `monkeytree launch`, or unset it to run plain") from None
        self._reader = self._socket.makefile("rb")
        # The barrier request differs only in its step: keep the rest encoded.
        self._barrier = (f'{{"v":{CHANNEL_VERSION},"type":"barrier","localRank":{local_rank},"step":').encode()

    def send(self, type_: str, **fields: object) -> None:
        message = {"v": CHANNEL_VERSION, "type": type_, "localRank": self.local_rank, **fields}
        self._socket.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def send_barrier(self, step: int) -> None:
        self._socket.sendall(self._barrier + str(step).encode() + b"}\n")

    def receive(self, expected: str) -> Message:
        line = self._reader.readline(_MAX_LINE)
        if not line:
            raise ChannelError(f"the launcher closed the channel {self.path} while this process waited for"
                               f" {expected}")
        if not line.endswith(b"\n"):
            raise ChannelError(f"the launcher sent a line of over {_MAX_LINE} bytes while this process waited"
                               f" for {expected}")
        try:
            message = json.loads(line)
        except ValueError as cause:
            raise ChannelError(f"the launcher sent a line that is not JSON ({cause}): {line[:200]!r}") from None
        if not isinstance(message, dict):
            raise ChannelError(f"the launcher sent {line[:200]!r}, not a JSON object")
        if message.get("v") != CHANNEL_VERSION:
            raise ChannelError(f"the launcher speaks channel version {message.get('v')!r}; this hook speaks"
                               f" v={CHANNEL_VERSION}")
        if message.get("type") == "error":
            raise ChannelError(f"the launcher refused: {message.get('message')}")
        if message.get("type") != expected:
            raise ChannelError(f"the launcher sent type {message.get('type')!r} while this process waited for"
                               f" {expected}")
        return message

    def directive(self) -> Message:
        message = self.receive("directive")
        if len(message) != 3 or "directive" not in message:
            _exact(message, "directive message", ("v", "type", "directive"))
        directive = message["directive"]
        if not isinstance(directive, dict):
            raise ChannelError(f"directive must be a JSON object, received {directive!r}")
        return directive

    def close(self) -> None:
        self._reader.close()
        self._socket.close()


# Process groups this process left, held until it has dropped what it built on them. A gloo
# group's destructor joins its worker threads; run from the C++ owner of a DDP wrapper's
# reducer it holds the GIL, which a worker thread may be waiting for to release a tensor, and
# the process hangs (torch 2.13). Dropped here, through Python's reference, it runs without it.
_left_groups: list[object] = []
atexit.register(_left_groups.clear)


def _leave_groups() -> None:
    """Destroys every process group this process is in, keeping each alive until the next barrier."""
    _left_groups.clear()
    _left_groups.extend(dist.distributed_c10d._world.pg_map)
    dist.destroy_process_group()


class Job:
    """This process's place in the job: what ``attach`` returns.

    ``rank``, ``world_size`` and ``generation`` change when a barrier returns ``"reconfigured"``.
    ``resuming`` is true in a replacement, which must ``load`` its state before training on from
    the step after ``resume_step``.
    """

    def __init__(self, rank: int, world_size: int, local_rank: int, generation: int = 0, managed: bool = False,
                 channel: _Channel | None = None, resume: _Resume | None = None, backend: str = "gloo",
                 timeout: timedelta = timedelta(minutes=5), control: ControlBlock | None = None,
                 premapped: Premapped | None = None) -> None:
        self.rank, self.world_size, self.local_rank, self.generation = rank, world_size, local_rank, generation
        self.managed = managed
        self.resume_step = resume["step"] if resume else None
        self.resuming = resume is not None
        self._resume = resume
        self._channel = channel
        self._control = control
        self._backend, self._timeout = backend, timeout
        self._premapped = premapped or Premapped([])
        # The steps after a move that are still to be timed, and when the current one began (wall,
        # this process's CPU): from the end of a replacement's load or a stayer's re-formation.
        self._timed_steps: list[str] = []
        self._step_began = (0.0, 0.0)

    def _where(self, buffer: str, offset: int, length: int) -> dict[str, Any]:
        """Where a save or load of that range goes: through its mapping when it was mapped ahead."""
        view = self._premapped.view(buffer, offset, length)
        return {"buffer": view} if view is not None else {"buffer": buffer, "offset": offset, "length": length}

    def load(self, template: StateDict) -> StateDict:
        """Fills ``template`` (as ``monkeytree.load`` does) from the checkpoint this replacement
        resumes from, reports the time to the launcher, and returns it."""
        resume, channel = self._resume, self._channel
        if resume is None or channel is None:
            raise RuntimeError("Job.load: this process is not a replacement (the launcher sent resume: null);"
                               " check job.resuming first")
        started = time.perf_counter()
        _load(template, **self._where(resume["buffer"], resume["offset"], resume["length"]))
        channel.send("phase", name="load", seconds=time.perf_counter() - started)
        self._time_steps()
        return template

    def barrier(self, step: int, state_fn: Callable[[], Mapping[str, object]]) -> Directive:
        """Meets the job after optimizer step ``step``. Returns ``"continue"``; ``"reconfigured"``
        when the process group was formed again (rebuild the DDP wrapper); or ``"stop"`` when the
        process group is gone and the script should exit 0. ``state_fn()`` returns the state dict to
        save and is called only when this process migrates out."""
        channel = self._channel
        if not self.managed or channel is None:
            return "continue"
        self._report_step(channel)
        # By now the script has rebuilt whatever it built on a group a reconfigure destroyed.
        _left_groups.clear()
        if self._control is not None and self._control.passes(step):
            return "continue"
        channel.send_barrier(step)
        directive = channel.directive()
        saved = False
        while True:
            kind = directive.get("kind")
            if kind == "continue":
                if len(directive) != 1:
                    _exact(directive, "continue directive", ("kind",))
                return "continue"
            if kind == "reconfigure":
                _exact(directive, "reconfigure directive", ("kind", *_GROUP))
                group = _group(directive, "reconfigure directive")
                started = time.perf_counter()
                _leave_groups()
                self._form(group)
                channel.send("phase", name="reform", seconds=time.perf_counter() - started)
                self._time_steps()
                return "reconfigured"
            if kind == "stop":
                _exact(directive, "stop directive", ("kind", "reason"))
                _leave_groups()
                channel.close()
                self.managed = False
                self._control = None
                return "stop"
            if kind == "migrate-out" and not saved:
                buffer, offset, length = _range({k: v for k, v in directive.items() if k != "kind"},
                                                "migrate-out directive")
                started = time.perf_counter()
                written = _save(state_fn(), **self._where(buffer, offset, length))
                channel.send("phase", name="checkpoint-write", seconds=time.perf_counter() - started)
                channel.send("saved", bytes=written)
                directive = channel.directive()
                saved = True
                continue
            allowed = "continue, reconfigure or stop" if saved else "continue, reconfigure, migrate-out or stop"
            raise ChannelError(f"directive: kind must be {allowed}, received {kind!r}")

    def _time_steps(self) -> None:
        self._timed_steps = ["first-step", "second-step"]
        self._step_began = _clocks()

    def _report_step(self, channel: _Channel) -> None:
        # The first step's wall and CPU time against the second's tell what a move added to it:
        # work of this process's own, or waiting (for a slower peer, or for a CPU others held).
        if not self._timed_steps:
            return
        (wall, cpu), (began_wall, began_cpu) = _clocks(), self._step_began
        name = self._timed_steps.pop(0)
        channel.send("phase", name=name, seconds=wall - began_wall)
        channel.send("phase", name=f"{name}-cpu", seconds=cpu - began_cpu)
        self._step_began = _clocks()

    def _form(self, group: _Group) -> None:
        # torchrun's static rendezvous tells its workers that its agent hosts the store
        # (TORCHELASTIC_USE_AGENT_STORE), so rank 0 would only connect to a store nobody
        # serves. The job-wide group is the hook's own: rank 0 hosts its store.
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
        if group["rank"] != 0:
            _await_store(group["addr"], group["port"], self._timeout)
        dist.init_process_group(self._backend, init_method=f"tcp://{group['addr']}:{group['port']}",
                                rank=group["rank"], world_size=group["world_size"], timeout=self._timeout)
        self.rank, self.world_size, self.generation = group["rank"], group["world_size"], group["generation"]


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _await_store(addr: str, port: int, timeout: timedelta) -> None:
    """Waits until rank 0's store accepts connections. A TCPStore client refused at first backs
    off for about 0.6 s before it tries again, and at a re-formation rank 0 opens its store only
    once it has left the old group: probed every few ms, the group forms as soon as it can."""
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        try:
            socket.create_connection((addr, port), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                return  # init_process_group reports the unreachable store, with torch's own message
            time.sleep(0.005)


def _preload() -> None:
    """Loads what torch loads on a process's first DDP or FSDP wrap, torch._dynamo (0.6 s of one
    CPU core). A replacement registers, and so lets the job pause, only once all its processes
    have attached: loaded before that, it costs the job no downtime."""
    importlib.import_module("torch._dynamo")


def resuming() -> bool:
    """Whether this process is a replacement's, which ``attach`` will hand a checkpoint to load.

    Known before ``attach``, which a replacement's launcher answers only once the move commits,
    with the job stopped: a script may build before it what needs no process group and what its
    load will fill (a DDP job's module and optimizer), while the job still trains.
    """
    return os.environ.get(CHANNEL_ENV) is not None and os.environ.get(RESUMING_ENV) == "1"


def attach(backend: str = "gloo", timeout: timedelta = timedelta(minutes=5)) -> Job:
    """Joins the job: forms the job-wide process group and returns this process's ``Job``.

    Under ``monkeytree launch`` the group's rank, size and address come from the launcher;
    without ``$MONKEYTREE_CHANNEL`` it is torchrun's own (``env://``) and the job is unmanaged.

    Raises:
        ChannelError: the launcher answered ``error``, sent a malformed message, or is unreachable.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    path = os.environ.get(CHANNEL_ENV)
    if not path:
        dist.init_process_group(backend, timeout=timeout)
        return Job(dist.get_rank(), dist.get_world_size(), local_rank, backend=backend, timeout=timeout)
    # Looked up now, so that a worker without the addon's CRC32C says so when it starts rather than
    # at its first migration, whose checkpoint write it slows.
    native_library()
    _preload()
    # Before attach, which a replacement's launcher answers once its move commits: off the stop.
    premapped = Premapped(expected_ranges(local_rank))
    channel = _Channel(path, local_rank)
    try:
        channel.send("attach", pid=os.getpid())
        message = channel.receive("attached")
        answered = time.perf_counter()
        _exact(message, "attached message", ("v", "type", "localRank", "resume", "control", *_GROUP))
        if _whole(message, "attached message", "localRank") != local_rank:
            raise ChannelError(f"attached message: localRank {message['localRank']} answers a process of"
                               f" LOCAL_RANK {local_rank}")
        group = _group(message, "attached message")
        resume: _Resume | None = None
        if message["resume"] is not None:
            buffer, offset, length = _range(message["resume"], "attached message: resume", ("step",))
            resume = {"buffer": buffer, "offset": offset, "length": length,
                      "step": _whole(message["resume"], "attached message: resume", "step")}
        job = Job(group["rank"], group["world_size"], local_rank, group["generation"], True, channel, resume,
                  backend, timeout, _control(message["control"]), premapped)
        job._form(group)
        channel.send("phase", name="form", seconds=time.perf_counter() - answered)
        return job
    except BaseException:
        channel.close()
        raise
