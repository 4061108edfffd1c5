"""Agent processes forked from one pre-imported parent: a restart costs a fork, not an
interpreter start (a second or more of imports), so a harness can kill and restart agents dozens
of times within seconds, in the run tests and in `mcp-once demo` alike.

Both halves of the protocol live here: `serve_forks(entry)` is the parent's loop (a JSON line on
stdin per agent to start: id, argv, environment, log file; it answers `started <id> <pid>` and
`exited <pid> <code>` lines, a killed child's code being minus its signal), and `Zygote` is the
harness's end, which starts that parent and forks agents through it. Each agent is a real process
with its own pid, killed by a real SIGKILL, reaped by the parent.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import anyio
import anyio.abc

from mcp_once.scenarios._endpoints import _ROOT, _child_env

__all__ = ["SOON", "Zygote", "serve_forks"]

#: Bound for anything that ends as soon as the awaited thing happens.
SOON = 60.0


def serve_forks(entry: Callable[[list[str]], int]) -> None:
    """The parent: everything imported once, then one `fork` per order read on stdin, the child
    running `entry(argv)` and exiting with its code. No threads and no event loop in here, so
    forking is safe; it returns when stdin closes, killing the children still running."""
    children: set[int] = set()
    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.02)
        if ready:
            # Raw reads, one buffer of our own: a buffered readline could swallow the next
            # order, which select would then never report.
            chunk = os.read(0, 65536)
            if not chunk:
                break
            pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            order = json.loads(line)
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    log = os.open(order["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                    os.dup2(log, 1)
                    os.dup2(log, 2)
                    os.environ.update(order["env"])
                    code = entry(order["argv"])
                except BaseException:
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            children.add(pid)
            print(f"started {order['id']} {pid}", flush=True)
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                print(f"exited {pid} {os.waitstatus_to_exitcode(status)}", flush=True)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


class Zygote:
    """The harness's end: `async with Zygote(argv, log_dir) as zygote:` starts the parent
    (`argv`, a program that calls `serve_forks`), then `await zygote.run(argv, env, log)` forks
    one agent with `argv` (its arguments) and `env` (added to the environment), its output
    appended to `log`, and returns its exit code once it ended (minus the signal if killed)."""

    def __init__(self, argv: Sequence[str], log_dir: Path) -> None:
        self.argv = list(argv)
        self.log_dir = log_dir
        self._ids = 0
        self._pids: dict[int, anyio.Event] = {}
        self._started: dict[int, tuple[anyio.Event, list[int]]] = {}
        self._exited: dict[int, int] = {}
        self._process: anyio.abc.Process | None = None
        self._group: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Zygote:
        env = {**_child_env(), "PYTHONUNBUFFERED": "1"}
        with (self.log_dir / "zygote.log").open("ab") as log:
            self._process = await anyio.open_process(self.argv, env=env, cwd=_ROOT, stderr=log)
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self._group.start_soon(self._read)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._process is not None and self._group is not None
        if self._process.stdin is not None:
            await self._process.stdin.aclose()
        with anyio.move_on_after(SOON):
            await self._process.wait()
        if self._process.returncode is None:
            self._process.kill()
        self._group.cancel_scope.cancel()
        await self._group.__aexit__(None, None, None)
        await self._process.aclose()

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        buffer = b""
        async for chunk in self._process.stdout:
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                kind, first, second = line.decode().split()
                if kind == "started":
                    event, slot = self._started.pop(int(first))
                    slot.append(int(second))
                    event.set()
                else:
                    self._exited[int(first)] = int(second)
                    self._pids.setdefault(int(first), anyio.Event()).set()

    async def run(self, argv: Sequence[str], env: Mapping[str, str], log: Path) -> int:
        assert self._process is not None and self._process.stdin is not None
        self._ids += 1
        order = self._ids
        event, slot = anyio.Event(), list[int]()
        self._started[order] = (event, slot)
        line = {"id": order, "argv": list(argv), "env": dict(env), "log": str(log)}
        await self._process.stdin.send((json.dumps(line) + "\n").encode())
        with anyio.fail_after(SOON):
            await event.wait()
            pid = slot[0]
            await self._pids.setdefault(pid, anyio.Event()).wait()
        self._pids.pop(pid, None)
        return self._exited.pop(pid)
