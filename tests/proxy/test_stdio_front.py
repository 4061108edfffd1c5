"""The proxy's stdio front (`mcp_once.proxy.stdio_front`) as a real process on real pipes, on
asyncio and trio (`stdio_front_echo.py`: each message echoed, each bad line answered): framing
(several messages in one read, one message across reads, a UTF-8 character split between them,
a message longer than a read and a write),
a bad line answered and the session going on, stray output of a handler and of its child kept
off the wire, EOF ending the process, a client gone from stdout ending it cleanly, no worker
thread, and the pipes' shared O_NONBLOCK flag never touched (the test holds the same open file
descriptions the process serves on). A regular file as stdin is served by the SDK's transport
(the fallback). `mcp-once proxy` itself on this front: the stdio tests of the other proxy
modules (`test_proxy_fast_path.py`, `test_proxy_real.py`, ...)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ECHO = str(Path(__file__).with_name("stdio_front_echo.py"))
DEADLINE = 20.0

pytestmark = pytest.mark.parametrize("backend", ["asyncio", "trio"])


def message(n: int, text: str = "") -> dict[str, Any]:
    params = {"name": "t", "text": text}
    return {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params}


def line(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False).encode() + b"\n"


@dataclass
class Served:
    """The echo program on pipes whose ends the test keeps a copy of: `stdin_read` and
    `stdout_write` are the very open file descriptions the process serves on."""

    process: subprocess.Popen[bytes]
    to_it: int
    from_it: int
    stdin_read: int
    stdout_write: int
    stderr: Path
    pending: bytearray = field(default_factory=bytearray)

    def send(self, data: bytes) -> None:
        """One write: the pipe delivers it whole (< PIPE_BUF) to the process's next read."""
        assert len(data) <= select.PIPE_BUF
        assert os.write(self.to_it, data) == len(data)

    def answer(self) -> dict[str, Any]:
        """The next line the process wrote, parsed (every line on the wire must be JSON)."""
        end = time.monotonic() + DEADLINE
        while b"\n" not in self.pending:
            left = end - time.monotonic()
            assert left > 0, f"no answer; stderr: {self.stderr.read_text()}"
            if select.select([self.from_it], [], [], left)[0]:
                chunk = os.read(self.from_it, 65536)
                assert chunk, f"stdout closed; stderr: {self.stderr.read_text()}"
                self.pending += chunk
        raw, _, rest = bytes(self.pending).partition(b"\n")
        self.pending[:] = rest
        decoded: dict[str, Any] = json.loads(raw)
        return decoded

    def flags_untouched(self) -> None:
        assert os.get_blocking(self.stdin_read) and os.get_blocking(self.stdout_write)


@contextmanager
def served(backend: str, tmp_path: Path) -> Iterator[Served]:
    stdin_read, to_it = os.pipe()
    from_it, stdout_write = os.pipe()
    stderr = tmp_path / "stderr.txt"
    with stderr.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, ECHO, backend], stdin=stdin_read, stdout=stdout_write, stderr=err
        )
    it = Served(process, to_it, from_it, stdin_read, stdout_write, stderr)
    try:
        yield it
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        for fd in (stdin_read, to_it, from_it, stdout_write):
            with suppress(OSError):
                os.close(fd)


def test_framing_bad_lines_stray_output_and_eof(backend: str, tmp_path: Path) -> None:
    with served(backend, tmp_path) as it:
        it.send(line(message(1)) + line(message(2)))  # two messages in one read
        assert [it.answer()["id"], it.answer()["id"]] == [1, 2]

        # One message across two reads, split inside a two-byte character: the first write is
        # read whole with message 3, so message 3's echo proves half of 4 is already read.
        fourth = line(message(4, "café au lait"))
        cut = fourth.index("é".encode()) + 1
        it.send(line(message(3)) + fourth[:cut])
        assert it.answer()["id"] == 3
        it.flags_untouched()  # while serving
        it.send(fourth[cut:])
        assert it.answer() == message(4, "café au lait")

        # Longer than one read takes and than one write gives: read in parts, written in parts.
        big = message(6, "ü" * 200_000)
        data = line(big)
        while data:
            data = data[os.write(it.to_it, data) :]
        assert it.answer() == big

        it.send(b"this is not json\n")
        invalid = it.answer()
        assert invalid["method"] == "test/invalid"
        assert invalid["params"] == {"error": "ValidationError", "threads": 1}  # no worker thread
        it.send(line(message(5)))  # the session goes on
        assert it.answer()["id"] == 5

        os.close(it.to_it)  # EOF: the session ends, the process exits
        assert it.process.wait(DEADLINE) == 0
        it.flags_untouched()  # after the exit
        os.close(it.stdout_write)  # our copy: the pipe now ends when what was written is read
        it.stdout_write = -1
        rest = b""
        while chunk := os.read(it.from_it, 65536):
            rest += chunk
        assert bytes(it.pending) + rest == b"", "stray output reached the wire"
        stray = it.stderr.read_text()
        assert stray.count("stray print") == stray.count("stray fd write") == 6
        assert stray.count("stray child") == 6  # one of each per message
        assert "Traceback" not in stray


def test_a_client_gone_from_stdout_ends_the_session(backend: str, tmp_path: Path) -> None:
    with served(backend, tmp_path) as it:
        it.send(line(message(1)))
        assert it.answer()["id"] == 1
        os.close(it.from_it)  # the client stops reading: the next answer meets a closed pipe
        it.from_it = -1
        it.send(line(message(2)))
        assert it.process.wait(DEADLINE) == 0  # stdin is still open: the write ended it
        assert "Traceback" not in it.stderr.read_text()
        it.flags_untouched()


def test_a_regular_file_as_stdin_falls_back_to_the_sdk(backend: str, tmp_path: Path) -> None:
    """A regular file cannot be waited on by the event loop: the SDK's transport (worker threads)
    serves it, with the same answers."""
    given = tmp_path / "stdin.jsonl"
    given.write_bytes(line(message(1)) + b"not json\n" + line(message(2)))
    out = tmp_path / "stdout.jsonl"
    with given.open("rb") as stdin, out.open("wb") as stdout:
        done = subprocess.run(
            [sys.executable, ECHO, backend],
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.PIPE,
            timeout=DEADLINE,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    first, invalid, second = (json.loads(raw) for raw in out.read_bytes().splitlines())
    assert (first["id"], second["id"]) == (1, 2)
    assert invalid["params"]["error"] == "ValidationError"
    assert invalid["params"]["threads"] > 1  # the SDK's reader thread: the fallback served it
