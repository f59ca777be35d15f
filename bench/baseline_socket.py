"""The plain-socket baseline for bench/transfer.ts: one TCP stream, no framing, no checksums,
sending straight from and receiving straight into the same /dev/shm staging buffers (recv
waits for whole 4 MiB pieces, as the engine's receiver does, to keep system calls few).

usage: baseline_socket.py recv NAME HOST LENGTH       -> prints {"port"}, then {"seconds"}
       baseline_socket.py send NAME HOST PORT LENGTH  -> prints {"bytes", "seconds"}
The sender's time runs from connect to the receiver's one-byte acknowledgement.
"""
import json
import mmap
import os
import socket
import sys
import time


def open_shm(name):
    # Pre-faulted like the engine's mappings, so page faults are not charged to the baseline.
    fd = os.open(f"/dev/shm/{name}", os.O_RDWR)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    finally:
        os.close(fd)


def say(message):
    print(json.dumps(message), flush=True)


def recv(name, host, length):
    view = memoryview(open_shm(name))
    server = socket.create_server((host, 0))
    say({"port": server.getsockname()[1]})
    conn, _ = server.accept()
    start = time.perf_counter()
    got = 0
    while got < length:
        n = conn.recv_into(view[got:length], min(length - got, 4 << 20), socket.MSG_WAITALL)
        if n == 0:
            raise SystemExit(f"sender closed after {got} of {length} bytes")
        got += n
    conn.sendall(b"k")
    say({"seconds": time.perf_counter() - start})


def send(name, host, port, length):
    view = memoryview(open_shm(name))[:length]
    start = time.perf_counter()
    conn = socket.create_connection((host, port))
    conn.sendall(view)
    if conn.recv(1) != b"k":
        raise SystemExit("receiver did not acknowledge")
    say({"bytes": length, "seconds": time.perf_counter() - start})


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "recv":
        recv(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif mode == "send":
        send(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
