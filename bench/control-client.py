"""The training process of bench/control.ts's measured host: started by `monkeytree launch` in
place of torchrun (it ignores torchrun's --nnodes, --node_rank, --master_addr and --master_port),
it attaches over $MONKEYTREE_CHANNEL and calls the per-iteration barrier, as a script calls
`job.barrier(step, state_fn)`, on a fixed period aligned to the wall clock, so that the bench's
simulated hosts reach the same barrier at the same instant.

usage: control-client.py [torchrun flags] --iterations N --period-ms P --echo PATH [--warmup W]

With --period-ms 0 the iterations follow each other with no pause.

Each iteration first times the same call on an unmanaged job (what the script pays under a plain
torchrun, where the barrier returns at once), then the barrier through the launcher and through
a bare echo of the channel at PATH (bench/channel-echo.ts: the machine's floor), in turns first,
each with time.perf_counter_ns. The barrier is the hook's own (`monkeytree.hook.Job.barrier` over its
`_Channel`) when the hook imports (it needs torch: the checkout's .venv), else a stand-in that
sends and reads the same bytes with the same checks on the path `continue` takes.

stdout, one JSON line each: {"start": EPOCH_NS, "periodNs", "firstStep", "client"} once warmed
up, then {"barrierNs": [...], "echoNs": [...], "plainNs": [...], "atNs": [...]} (atNs: the
wall-clock time each barrier through the launcher began, to compare with the simulated hosts'
rounds).
"""
import argparse
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))

CHANNEL_VERSION = 1


class StandInChannel:
    """The hook's `_Channel` on the path a `continue` barrier takes: one line out, one line back."""

    def __init__(self, path):
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.connect(path)
        self._reader = self._socket.makefile("rb")
        self._barrier = f'{{"v":{CHANNEL_VERSION},"type":"barrier","localRank":0,"step":'.encode()

    def send(self, type_, **fields):
        message = {"v": CHANNEL_VERSION, "type": type_, "localRank": 0, **fields}
        self._socket.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def receive(self, expected):
        line = self._reader.readline(1 << 20)
        message = json.loads(line)
        if not isinstance(message, dict) or message.get("v") != CHANNEL_VERSION or message.get("type") != expected:
            raise SystemExit(f"control-client: expected {expected}, got {line[:200]!r}")
        return message


class StandInJob:
    """`Job.barrier` for an unmanaged job (returns at once) and for a managed one that continues."""

    def __init__(self, channel):
        self._channel = channel

    def barrier(self, step, state_fn):
        channel = self._channel
        if channel is None:
            return "continue"
        channel._socket.sendall(channel._barrier + str(step).encode() + b"}\n")
        message = channel.receive("directive")
        directive = message["directive"]
        if len(message) != 3 or not isinstance(directive, dict):
            raise SystemExit(f"control-client: malformed directive message {message!r}")
        if directive.get("kind") == "continue" and len(directive) == 1:
            return "continue"
        raise SystemExit(f"control-client: expected continue, got {directive!r}")


def jobs(path):
    """The managed job (attached over the channel, its process group not formed: the other hosts are
    simulated) and an unmanaged one, each with the hook's Job when it imports."""
    try:
        from monkeytree.hook import Job, _Channel, _control
    except ImportError:
        channel = StandInChannel(path)
        channel.send("attach", pid=os.getpid())
        channel.receive("attached")
        return StandInJob(channel), StandInJob(None), "stand-in"
    channel = _Channel(path, 0)
    channel.send("attach", pid=os.getpid())
    attached = channel.receive("attached")
    managed = Job(attached["rank"], attached["worldSize"], 0, attached["generation"], True, channel,
                  control=_control(attached["control"]))
    return managed, Job(0, 1, 0), "hook"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--period-ms", type=float, required=True)
    parser.add_argument("--echo", required=True)
    parser.add_argument("--warmup", type=int, default=200)
    args, _torchrun = parser.parse_known_args()
    managed, plain, client = jobs(os.environ["MONKEYTREE_CHANNEL"])
    echo, _, _ = jobs(args.echo)

    def state_fn():
        return {}

    step = 0
    for _ in range(args.warmup):
        managed.barrier(step, state_fn)
        echo.barrier(step, state_fn)
        plain.barrier(step, state_fn)
        step += 1
    period = int(args.period_ms * 1e6)
    # Half a second from now, on a period boundary: the bench starts its rounds on the same ones.
    start = time.time_ns() + 500_000_000
    if period:
        start = start // period * period + period
    print(json.dumps({"start": start, "periodNs": period, "firstStep": step, "client": client}), flush=True)
    clock = time.perf_counter_ns
    barrier_ns, echo_ns, plain_ns, at_ns = [], [], [], []

    def timed(job, into):
        begun = clock()
        if job.barrier(step, state_fn) != "continue":
            raise SystemExit(f"control-client: barrier {step} did not continue")
        into.append(clock() - begun)

    for i in range(args.iterations):
        wait = start + i * period - time.time_ns()
        if wait > 0:
            time.sleep(wait / 1e9)
        a = clock()
        plain.barrier(step, state_fn)
        plain_ns.append(clock() - a)
        if i % 2:
            timed(echo, echo_ns)
        at_ns.append(time.time_ns())
        timed(managed, barrier_ns)
        if not i % 2:
            timed(echo, echo_ns)
        step += 1
    print(json.dumps({"barrierNs": barrier_ns, "echoNs": echo_ns, "plainNs": plain_ns, "atNs": at_ns}), flush=True)


if __name__ == "__main__":
    main()
