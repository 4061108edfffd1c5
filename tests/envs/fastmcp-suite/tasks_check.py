"""Rule 23 against the real `fastmcp-tasks` (Docket on a real redis-server): a keyed
task-augmented call under `IdempotencyMiddleware` creates one task, a re-send gets the same task
(marked replayed), other arguments are -32011, and the re-send's task id resolves through
`tasks/get` to the one execution's result. Then the body against a Docket redelivery, with
the worker a process of its own (`tasks_server.py`, over streamable HTTP) SIGKILLed at an exact
point and a second server process's worker taking the execution over: killed after the body
returned (its result stored) before Docket completed the execution, the redelivery replays it
(one ledger line, the task completed with it); killed mid-body after its effect, the
redelivery finds the body's record UNKNOWN (-32012, the task failed, one ledger line) and
`mcp-once keys settle` settles it. Without the fence both redeliveries run the body again.

fastmcp-tasks 4.1.6 is not on PyPI, so this runs in the suite's environment with the sdist's
`fastmcp_tasks/` on the path (as `run.py` does; `--source` as there, filled by `run.py`):

    cd tests/envs/fastmcp-suite && uv sync --frozen
    uv run --frozen python tasks_check.py [--source /tmp/fastmcp-4.1.6]

Exit status 0 when every check holds; each check's outcome is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

KEY = "check-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def check(url: str) -> list[tuple[str, bool, str]]:
    from fastmcp import Client, FastMCP
    from fastmcp_tasks import TasksExtension

    from idempotency import open_store, wire
    from idempotency.fastmcp import IdempotencyMiddleware

    effects: list[str] = []
    server: FastMCP[Any] = FastMCP("works")
    store = open_store(f"{url}?prefix=keys:")
    server.add_middleware(IdempotencyMiddleware(store))
    server.add_extension(TasksExtension(url=url, name="works-check"))

    @server.tool(task=True)
    async def deploy(env: str) -> str:
        effects.append(env)
        return f"deployed {env}"

    def status(answer: Any) -> str | None:
        return ((answer.meta or {}).get(wire.IDEMPOTENCY_META) or {}).get("status")

    meta = {wire.KEY_META: KEY}
    args = {"env": "prod"}
    async with Client(server) as client:
        session = client.session
        first = await session.call_tool("deploy", args, meta=meta, allow_claimed=True)
        again = await session.call_tool("deploy", args, meta=meta, allow_claimed=True)
        # The claim's resolver polls tasks/get for the (replayed) task to its result.
        resolved = await client.call_tool("deploy", args, meta=meta)
        try:
            await session.call_tool("deploy", {"env": "staging"}, meta=meta, allow_claimed=True)
            refused = None
        except Exception as exc:  # the JSON-RPC error
            refused = getattr(getattr(exc, "error", None), "code", None)
    await store.aclose()
    return [
        refusal(),
        ("one task for the key", first.task_id == again.task_id, f"{first.task_id[:12]}…"),
        (
            "executed, then replayed",
            [status(first), status(again)] == ["executed", "replayed"],
            f"{status(first)}, {status(again)}",
        ),
        (
            "the replayed task resolves to the one execution",
            effects == ["prod"] and resolved.data == "deployed prod",
            f"effects={effects}",
        ),
        ("other arguments: -32011", refused == wire.KEY_REUSED, f"{refused}"),
    ]


def refusal() -> tuple[str, bool, str]:
    """A `fastmcp-tasks` whose bodies the middleware cannot fence is refused when it is built."""
    from fastmcp_tasks import components

    from idempotency import MemoryKeyStore
    from idempotency.fastmcp import IdempotencyMiddleware

    installed = components.reentrant_task_fn
    del components.reentrant_task_fn
    try:
        IdempotencyMiddleware(MemoryKeyStore())
        detail = "built"
    except RuntimeError as exc:
        detail = str(exc)
    finally:
        components.reentrant_task_fn = installed
    return (
        "no reentrant_task_fn: the middleware refuses",
        "reentrant_task_fn" in detail,
        detail[:60] + "…",
    )


def serve(port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`tasks_server.py` on `port` (its Docket worker inside), once it accepts connections."""
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("tasks_server.py")), str(port)],
        env={**os.environ, **env},
    )
    wait_for_port(port, process)
    return process


def wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    """Until `process` listens on `port` (raises if it exits first, or after 30 s)."""
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args} exited ({process.returncode})") from None
            anyio.run(anyio.sleep, 0.05)
    raise RuntimeError(f"{process.args}: nothing listening on {port}")


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines()) if path.exists() else 0


def keys(*args: str) -> str:
    """`mcp-once keys ARGS` (this environment's mcp-once, the working tree's)."""
    command = [str(Path(sys.executable).with_name("mcp-once")), "keys", *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"mcp-once keys {args[0]}: exit {done.returncode}: {done.stderr}")
    return done.stdout


def redelivery(url: str, folder: Path, kill: str) -> list[tuple[str, bool, str]]:
    """A keyed task whose worker process SIGKILLs itself at `kill`; the next server process's
    worker gets the execution from Docket."""
    from fastmcp import Client
    from fastmcp.client.client import CallToolResult

    from idempotency import wire

    ledger = folder / f"ledger-{kill}"
    env = {
        "TASKS_CHECK_REDIS": url,
        "TASKS_CHECK_DOCKET": f"works-{kill}",
        "TASKS_CHECK_LEDGER": str(ledger),
        "TASKS_CHECK_GO": str(folder / f"go-{kill}"),
        "PYTHONPATH": os.pathsep.join([*sys.path[:1], os.environ.get("PYTHONPATH", "")]),
    }
    meta = {wire.KEY_META: f"redelivery-{kill}"}
    args = {"env": "prod"}
    port = free_port()
    first = serve(port, {**env, "TASKS_CHECK_KILL": kill})

    async def create() -> str:
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            task = await client.session.call_tool("deploy", args, meta=meta, allow_claimed=True)
            return str(task.task_id)

    try:
        task_id = anyio.run(create)
        Path(env["TASKS_CHECK_GO"]).touch()
        killed = first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    effects_at_kill = lines(ledger)
    port = free_port()
    second = serve(port, env)

    async def resolve() -> tuple[str, CallToolResult]:
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            again = await client.session.call_tool("deploy", args, meta=meta, allow_claimed=True)
            # The claim's resolver polls tasks/get to the task's end: its result, or for a
            # failed task its JSON-RPC error as an error result.
            with anyio.fail_after(60):
                outcome = await client.call_tool("deploy", args, meta=meta, raise_on_error=False)
            return str(again.task_id), outcome

    try:
        again, outcome = anyio.run(resolve)
    finally:
        second.terminate()
        second.wait()
    checks = [
        (
            f"[{kill}] the worker process SIGKILLed",
            killed == -9 and effects_at_kill == 1,
            f"exit {killed}, {effects_at_kill} ledger line",
        ),
        (f"[{kill}] the re-send gets the same task", again == task_id, f"{task_id[:12]}…"),
    ]
    text = " ".join(getattr(block, "text", "") for block in outcome.content)
    if kill == "completed":
        data = outcome.data
        return [
            *checks,
            (
                "[completed] the redelivered body replays, not runs again",
                lines(ledger) == 1 and data == "deployed prod",
                f"{lines(ledger)} ledger line(s), {data!r}",
            ),
        ]
    store = f"{url}?prefix=keys:"
    unknown = json.loads(keys("list", "--state", "unknown", "--json", "--store", store) or "[]")
    names = [row["key"] for row in unknown if str(row.get("tool", "")).endswith("#task-body")]
    if len(names) == 1:
        keys("settle", names[0], "--result-text", "deployed prod", "--store", store)
    settled = json.loads(keys("list", "--state", "completed", "--json", "--store", store) or "[]")
    return [
        *checks,
        (
            "[effect] the redelivered body is OUTCOME_UNKNOWN, not run again",
            lines(ledger) == 1 and outcome.is_error and "outcome of the call" in text,
            f"{lines(ledger)} ledger line(s), {text[:60]!r}…",
        ),
        (
            "[effect] mcp-once keys settle settles the body's record",
            len(names) == 1 and any(row["key"] == names[0] for row in settled),
            f"{len(names)} UNKNOWN body record(s)",
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=Path("/tmp/fastmcp-4.1.6"))
    options = parser.parse_args()
    tasks = options.source / "fastmcp_tasks"
    if not tasks.is_dir():
        print(f"no {tasks}: run `python run.py` once (it unpacks the sdist there)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(tasks))
    binary = shutil.which("redis-server")
    if binary is None:
        print("redis-server is not on PATH", file=sys.stderr)
        return 2
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        redis = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", folder],
            stdout=subprocess.DEVNULL,
        )
        try:
            wait_for_port(port, redis)
            url = f"redis://127.0.0.1:{port}/0"
            results = anyio.run(check, url)
            for kill in ("completed", "effect"):
                results += redelivery(url, Path(folder), kill)
        finally:
            redis.terminate()
            redis.wait()
    for name, held, detail in results:
        print(f"{'ok  ' if held else 'FAIL'} {name} ({detail})")
    return 0 if all(held for _, held, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
