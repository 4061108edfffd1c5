"""Rule 23 against the real `fastmcp-tasks` (Docket on a real redis-server): a keyed
task-augmented call under `IdempotencyMiddleware` creates one task, a re-send gets the same task
(marked replayed), other arguments are -32011, and the re-send's task id resolves through
`tasks/get` to the one execution's result.

fastmcp-tasks 4.1.6 is not on PyPI, so this runs in the suite's environment with the sdist's
`fastmcp_tasks/` on the path (as `run.py` does; `--source` as there, filled by `run.py`):

    cd tests/envs/fastmcp-suite && uv sync --frozen
    uv run --frozen python tasks_check.py [--source /tmp/fastmcp-4.1.6]

Exit status 0 when every check holds; each check's outcome is printed.
"""

from __future__ import annotations

import argparse
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
            for _ in range(200):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if redis.poll() is not None:
                        raise RuntimeError("redis-server exited") from None
                    anyio.run(anyio.sleep, 0.05)
            results = anyio.run(check, f"redis://127.0.0.1:{port}/0")
        finally:
            redis.terminate()
            redis.wait()
    for name, held, detail in results:
        print(f"{'ok  ' if held else 'FAIL'} {name} ({detail})")
    return 0 if all(held for _, held, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
