"""The hook's side of sdk/contract/protocol/channel.ts without a launcher: message validation, and a
channel to a socket this process serves itself."""
from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monkeytree import hook
from monkeytree.hook import ChannelError

GROUP = {"rank": 1, "worldSize": 4, "masterAddr": "10.0.0.1", "masterPort": 29500, "generation": 3}


def test_whole_accepts_integers_in_range_and_names_the_field_otherwise() -> None:
    assert hook._whole({"n": 5}, "msg", "n", 1, 5) == 5
    for value in (None, "5", 5.0, True, -1):
        with pytest.raises(ChannelError, match=rf"^msg: n must be an integer >= 0, received {value!r}$"):
            hook._whole({"n": value}, "msg", "n")
    with pytest.raises(ChannelError, match=r"^msg: port must be an integer \[1, 65535\], received 70000$"):
        hook._whole({"port": 70000}, "msg", "port", 1, 65535)


def test_text_needs_a_non_empty_string() -> None:
    assert hook._text({"s": "x"}, "msg", "s") == "x"
    for value in ("", 3, None):
        with pytest.raises(ChannelError, match=rf"^msg: s must be a non-empty string, received {value!r}$"):
            hook._text({"s": value}, "msg", "s")


def test_exact_names_missing_and_unknown_fields() -> None:
    hook._exact({"a": 1, "b": 2}, "msg", ("a", "b"))
    with pytest.raises(ChannelError, match=r"^msg must be a JSON object, received \[1\]$"):
        hook._exact([1], "msg", ("a",))
    with pytest.raises(ChannelError, match=r"^msg: missing fields \['b'\], unknown fields \['c'\]; the launcher"
                                           r" and this hook speak different versions"):
        hook._exact({"a": 1, "c": 2}, "msg", ("a", "b"))


def test_group_reads_a_process_group_and_keeps_the_rank_below_the_size() -> None:
    assert hook._group(GROUP, "attached message") == {"rank": 1, "world_size": 4, "addr": "10.0.0.1", "port": 29500,
                                                      "generation": 3}
    with pytest.raises(ChannelError, match=r"^attached message: rank 4 is not below worldSize 4$"):
        hook._group({**GROUP, "rank": 4}, "attached message")
    with pytest.raises(ChannelError, match=r"^attached message: worldSize must be an integer >= 1, received 0$"):
        hook._group({**GROUP, "worldSize": 0}, "attached message")
    with pytest.raises(ChannelError, match=r"masterPort must be an integer \[1, 65535\], received 0$"):
        hook._group({**GROUP, "masterPort": 0}, "attached message")


def test_range_names_a_buffer_in_dev_shm_and_a_byte_range() -> None:
    assert hook._range({"buffer": "mt-1", "offset": 64, "length": 128}, "resume") == ("mt-1", 64, 128)
    assert hook._range({"buffer": "b", "offset": 0, "length": 1, "step": 9}, "resume", ("step",)) == ("b", 0, 1)
    for buffer in ("../etc/passwd", "a/b", ".", ".."):
        with pytest.raises(ChannelError, match=r"^resume: buffer must be a file name in /dev/shm"):
            hook._range({"buffer": buffer, "offset": 0, "length": 1}, "resume")
    with pytest.raises(ChannelError, match=r"^resume: length must be an integer >= 0, received -1$"):
        hook._range({"buffer": "b", "offset": 0, "length": -1}, "resume")
    with pytest.raises(ChannelError, match=r"missing fields \['step'\]"):
        hook._range({"buffer": "b", "offset": 0, "length": 1}, "resume", ("step",))


class _Launcher:
    """The launcher's end of one process's channel, served by the test itself."""

    def __init__(self, directory: Path) -> None:
        self.path = str(directory / "channel.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(1)
        self.channel = hook._Channel(self.path, 2)
        self._peer, _ = self._server.accept()
        self._lines = self._peer.makefile("rb")

    def send(self, data: bytes | dict[str, Any]) -> None:
        line = data if isinstance(data, bytes) else json.dumps(data).encode() + b"\n"
        self._peer.sendall(line)

    def request(self) -> Any:
        return json.loads(self._lines.readline())

    def close(self) -> None:
        self._lines.close()
        self._peer.close()
        self._server.close()
        self.channel.close()


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[_Launcher]:
    served = _Launcher(tmp_path)
    yield served
    served.close()


def test_requests_are_json_lines_with_version_type_and_local_rank(launcher: _Launcher) -> None:
    launcher.channel.send("attach", pid=42)
    assert launcher.request() == {"v": 1, "type": "attach", "localRank": 2, "pid": 42}
    launcher.channel.send_barrier(17)
    assert launcher.request() == {"v": 1, "type": "barrier", "localRank": 2, "step": 17}


@pytest.mark.parametrize(("reply", "message"), [
    (b"not json\n", r"^the launcher sent a line that is not JSON"),
    (b"[1]\n", r"^the launcher sent b'\[1\]\\n', not a JSON object$"),
    ({"v": 2, "type": "attached"}, r"^the launcher speaks channel version 2; this hook speaks v=1$"),
    ({"v": 1, "type": "error", "message": "no such worker"}, r"^the launcher refused: no such worker$"),
    ({"v": 1, "type": "directive"}, r"^the launcher sent type 'directive' while this process waited for attached$"),
])
def test_a_reply_that_breaks_the_protocol_raises_channel_error(launcher: _Launcher, reply: bytes | dict[str, Any],
                                                               message: str) -> None:
    launcher.send(reply)
    with pytest.raises(ChannelError, match=message):
        launcher.channel.receive("attached")


def test_a_closed_channel_raises_channel_error(launcher: _Launcher) -> None:
    launcher._peer.shutdown(socket.SHUT_WR)
    with pytest.raises(ChannelError, match=r"^the launcher closed the channel .*channel.sock while this process waited"
                                           r" for directive$"):
        launcher.channel.receive("directive")


def test_an_unreachable_channel_says_how_to_run(tmp_path: Path) -> None:
    with pytest.raises(ChannelError, match=r"cannot connect to the launcher's channel MONKEYTREE_CHANNEL=.*; start the"
                                           r" script under `monkeytree launch`"):
        hook._Channel(str(tmp_path / "absent.sock"), 0)


def test_a_barrier_that_continues(launcher: _Launcher) -> None:
    job = hook.Job(0, 1, 2, managed=True, channel=launcher.channel)
    launcher.send({"v": 1, "type": "directive", "directive": {"kind": "continue"}})
    assert job.barrier(5, dict) == "continue"
    assert launcher.request()["step"] == 5


@pytest.mark.parametrize(("directive", "message"), [
    ({"kind": "pause"}, r"^directive: kind must be continue, reconfigure, migrate-out or stop, received 'pause'$"),
    ({"kind": "continue", "extra": 1}, r"^continue directive: missing fields \[\], unknown fields \['extra'\]"),
    ({"kind": "stop"}, r"^stop directive: missing fields \['reason'\]"),
    ({"kind": "migrate-out", "buffer": "x/y", "offset": 0, "length": 1}, r"^migrate-out directive: buffer must be"),
    ({"kind": "reconfigure", **GROUP, "rank": 9}, r"^reconfigure directive: rank 9 is not below worldSize 4$"),
    ("continue", r"^directive must be a JSON object, received 'continue'$"),
])
def test_a_malformed_directive_raises_channel_error(launcher: _Launcher, directive: Any, message: str) -> None:
    job = hook.Job(0, 1, 2, managed=True, channel=launcher.channel)
    launcher.send({"v": 1, "type": "directive", "directive": directive})
    with pytest.raises(ChannelError, match=message):
        job.barrier(1, dict)


def test_an_unmanaged_job_always_continues_and_cannot_load() -> None:
    job = hook.Job(0, 1, 0)
    assert job.barrier(1, dict) == "continue"
    with pytest.raises(RuntimeError, match="this process is not a replacement"):
        job.load({})



@pytest.mark.parametrize(("channel", "flag", "expected"), [
    ("/run/launcher.sock", "1", True),
    ("/run/launcher.sock", "0", False),
    ("/run/launcher.sock", None, False),
    (None, "1", False),  # a plain run resumes nothing, whatever its environment says
])
def test_resuming_is_known_before_attach(monkeypatch: pytest.MonkeyPatch, channel: str | None, flag: str | None,
                                         expected: bool) -> None:
    for name, value in ((hook.CHANNEL_ENV, channel), (hook.RESUMING_ENV, flag)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert hook.resuming() is expected
