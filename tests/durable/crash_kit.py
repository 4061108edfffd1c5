"""The test side of a durable-engine crash test: a real shop server, its ledger, and a worker
process that dies in one of three windows and is restarted.

The windows (`WINDOWS`), in the life of one MCP tool call made by an engine's step:
- `before`: the worker dies just before the request is sent (`crash_point("before")`);
- `during`: the tool is running on the server (the ledger shows it `started`; the server holds
  it `HOLD` seconds) when the test SIGKILLs the worker;
- `after`: the server answered and the worker dies before the engine recorded the answer
  (`crash_point("after")`, right after the call returned).
The restarted worker (same command, same environment; the crash mark makes it go on) lets the
engine re-run the step. The count that matters is the ledger's: rows the tool body writes itself
(`mcp_once.scenarios`), outside mcp-once, in a SQLite file that survives every process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import anyio
import anyio.to_thread
import pytest

from mcp_once.scenarios._endpoints import ServerProcess, server_command
from mcp_once.scenarios._ledger import Effect, Ledger

sys.path.insert(0, str(Path(__file__).parent))
from crash_point import CRASHED, MARK, STANDBY, WINDOW

ROOT = Path(__file__).resolve().parents[2]
Window = Literal["before", "during", "after"]
WINDOWS: tuple[Window, ...] = ("before", "during", "after")
#: Seconds the server holds a `pay` mid-run (after its effect), so the test can kill the
#: worker while the tool runs; a re-run arriving meanwhile waits for the claim, then replays.
HOLD = 1.5
#: Bound for anything that ends as soon as the awaited thing happens.
SOON = 60.0
#: Crash cases run at once (`side_by_side`): most of a case is worker start-up (seconds of CPU
#: importing an engine's SDK) and waiting on other processes; this machine has 2 cores.
AT_ONCE = 3

T = TypeVar("T")


@dataclass
class DurableShop:
    """The shop server (`pay`, `set_value`, `notify`) over streamable HTTP, and its ledger."""

    url: str
    ledger: Ledger
    guarded: bool

    def effects(self, call_id: str) -> list[Effect]:
        return self.ledger.by_call().get(call_id, [])


@contextmanager
def running_shop(
    tmp: Path, *, guarded: bool = True, retention: float | None = None, hold: float = HOLD
) -> Iterator[DurableShop]:
    """A shop server process, guarded by a SQLite key store (or not), that holds `pay` for
    `hold` seconds on its first attempt (0: never, for harnesses that kill in the agent
    instead); `retention` (seconds a completed record is kept, the
    guard's default if None) is for tests of what happens once a record is gone. Synchronous,
    for a module-scoped fixture (one shop for many tests, each with call ids of its own)."""
    ledger = Ledger(tmp / "ledger.sqlite3")
    store = f"sqlite:///{tmp / 'keys.sqlite3'}" if guarded else None
    process = ServerProcess(
        lambda port: server_command(
            "http", ledger, store, port=port, hold=hold, retention=retention
        )
    )
    process.start()
    try:
        yield DurableShop(process.url, ledger, guarded)
    finally:
        process.stop()


@asynccontextmanager
async def durable_shop(
    tmp: Path, *, guarded: bool = True, retention: float | None = None, hold: float = HOLD
) -> AsyncIterator[DurableShop]:
    """`running_shop`, started and stopped off the event loop."""
    shop = running_shop(tmp, guarded=guarded, retention=retention, hold=hold)
    entered = await anyio.to_thread.run_sync(shop.__enter__)
    try:
        yield entered
    finally:
        await anyio.to_thread.run_sync(shop.__exit__, None, None, None)


def worker_env(window: Window, tmp: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker that dies in `window` (once per test, by the mark in `tmp`),
    with the repository and this folder importable."""
    env = dict(os.environ)
    env[WINDOW] = window
    env[MARK] = str(tmp / f"crashed-{window}")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(Path(__file__).parent), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class CrashingWorker:
    """A worker process started with a crash window; `crashed()` waits until it died there.

    Its output goes to a log file in `tmp` (named by `name`), which failures print.

    `standby()` starts the replacement early (held in `crash_point.standby()` until `start()`
    releases it), for workers whose imports cost seconds: the restart then costs what the
    engine's recovery costs, not an interpreter start.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        window: Window,
        tmp: Path,
        name: str = "worker",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.window = window
        self.env = worker_env(window, tmp, env)
        self.log = tmp / f"{name}.log"
        self.processes: list[subprocess.Popen[bytes]] = []
        self._standby: subprocess.Popen[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        """Start (or restart) the worker: same command, same environment; or release the one
        on standby."""
        process = self._standby
        if process is not None:
            self._standby = None
            assert process.stdin is not None
            process.stdin.write(b"go\n")
            process.stdin.close()
        else:
            process = self._spawn(self.env)
        self.processes.append(process)
        return process

    def standby(self) -> None:
        """Start the next worker now, held before it connects until `start()` releases it.

        The worker must call `crash_point.standby()` where it may wait (after its imports)."""
        assert self._standby is None, "a worker is already on standby"
        self._standby = self._spawn({**self.env, STANDBY: "1"}, stdin=subprocess.PIPE)

    def _spawn(self, env: Mapping[str, str], stdin: int | None = None) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as out:
            return subprocess.Popen(
                self.argv, env=env, cwd=ROOT, stdin=stdin, stdout=out, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    async def crashed(
        self, ledger: Ledger, *, started: int = 1, call_id: str | None = None
    ) -> None:
        """Return once the newest worker died in its window: for `during`, SIGKILL it as soon as
        the ledger shows `started` tool runs (the window is the server's, not the worker's) — of
        logical call `call_id` only, when given, so workers sharing one shop can run at once."""
        process = self.processes[-1]
        if self.window == "during":
            with anyio.fail_after(SOON):
                while (
                    len([e for e in ledger.events("started") if call_id in (None, e[1])]) < started
                ):
                    if process.poll() is not None:
                        raise AssertionError(
                            f"worker exited {process.returncode} before the tool started:\n"
                            + self.output()
                        )
                    # Another process writes the ledger: a bounded poll is the only signal.
                    await anyio.sleep(0.02)
            process.send_signal(signal.SIGKILL)
        code = await self.wait(process)
        expected = -signal.SIGKILL if self.window == "during" else CRASHED
        assert code == expected, (
            f"the worker was to die in window {self.window!r} (exit {expected}), exited {code}:\n"
            + self.output()
        )

    async def wait(self, process: subprocess.Popen[bytes] | None = None) -> int:
        """The exit status of `process` (the newest worker by default), waited for."""
        target = process if process is not None else self.processes[-1]
        with anyio.fail_after(SOON):
            return await anyio.to_thread.run_sync(target.wait)

    def stop(self) -> None:
        """Kill whatever is still running (a test's cleanup)."""
        standby, self._standby = self._standby, None
        for process in [*self.processes, *([standby] if standby is not None else [])]:
            if process.poll() is None:
                process.kill()
                process.wait()


def side_by_side(
    cases: Mapping[str, Callable[[], Awaitable[T]]], at_once: int = AT_ONCE
) -> dict[str, T | Exception]:
    """Run every case (an async callable) in one event loop, `at_once` of them at a time, and
    return what each returned or raised, by name: for a module fixture whose tests then check
    one case each (`outcome`), so test ids and assertions stay per case."""
    found: dict[str, T | Exception] = {}

    async def one(name: str, limiter: anyio.CapacityLimiter) -> None:
        async with limiter:
            try:
                found[name] = await cases[name]()
            except Exception as error:  # raised again by the case's own test
                found[name] = error

    async def every() -> None:
        limiter = anyio.CapacityLimiter(at_once)
        async with anyio.create_task_group() as group:
            for name in cases:
                group.start_soon(one, name, limiter)

    anyio.run(every)
    return found


def crash_cases(
    cases: Sequence[Any],
    tmp_path_factory: pytest.TempPathFactory,
    run: Callable[..., Awaitable[T]],
    *args: Any,
    at_once: int = AT_ONCE,
) -> dict[str, T | Exception]:
    """`side_by_side` of `run(*args, tmp, *case.values)` for every `pytest.param` case, each in
    a folder of its own, by the case's id (what its test finds with `outcome`)."""
    return side_by_side(
        {
            str(case.id): partial(run, *args, tmp_path_factory.mktemp(str(case.id)), *case.values)
            for case in cases
        },
        at_once,
    )


class Finishing(Protocol):
    """A started workflow (a Temporal `WorkflowHandle`): its result, once it has one."""

    async def result(self) -> Any: ...


async def result_after_crash(
    worker: CrashingWorker,
    ledger: Ledger,
    call_id: str,
    workflow: Finishing,
    take_over: Callable[[], object],
) -> Any:
    """Once `worker` died in its window (for `call_id`), `take_over()` (start the replacement)
    and return the workflow's result, which the replacement's re-run of the step gives."""
    await worker.crashed(ledger, call_id=call_id)
    take_over()
    with anyio.fail_after(SOON):
        return await workflow.result()


def outcome(found: Mapping[str, T | Exception], name: str) -> T:
    """The result of case `name` of `side_by_side`; what it raised, raised again here."""
    result = found[name]
    if isinstance(result, Exception):
        raise result
    return result
