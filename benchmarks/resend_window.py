"""Rule 15's residual window: from the guard's last look at the caller to the SDK's answer write.

A keyless call's answer is recorded as delivered unless the guard sees its caller give up (a
cancel at any time, a cancelled request scope until the guard returns). What it cannot see is a
connection that breaks, with no cancel behind it, after its last look and before the SDK writes
the answer: the record then says delivered, and that caller's re-send (on a new connection, so
only under an authenticated principal) runs again. This measures that gap on real sessions: the
guard's last look (`Guard._answered` returning) to the dispatcher starting the answer's write
(`JSONRPCDispatcher._write_result`), per keyed-by-derivation call, in process over memory
streams (handshake era; the in-memory and stdio transports share the dispatcher), on the memory
and SQLite stores. Both ends are timed by wrapping the two methods for the run (private seams of
the guard and of the SDK: only this benchmark touches them).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from mcp.client import Client
from mcp.server.mcpserver import MCPServer
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

import idempotency._guard.guard as guard_module
from idempotency import KeyStore, MemoryKeyStore, SQLiteKeyStore, install

from ._scale import Scale, run_async
from ._standalone import standalone


class _Gaps:
    """Wraps the two seams for one run and collects the gaps between them (seconds)."""

    def __init__(self) -> None:
        self.gaps: list[float] = []
        self._looked: float | None = None

    def __enter__(self) -> _Gaps:
        answered: Callable[..., Awaitable[None]] = guard_module.Guard._answered
        write: Callable[..., Awaitable[None]] = JSONRPCDispatcher._write_result
        self._originals = (answered, write)
        gaps = self

        async def timed_answered(self: Any, *args: Any, **kwargs: Any) -> None:
            await answered(self, *args, **kwargs)
            gaps._looked = time.perf_counter()

        async def timed_write(self: Any, *args: Any, **kwargs: Any) -> None:
            if gaps._looked is not None:
                gaps.gaps.append(time.perf_counter() - gaps._looked)
                gaps._looked = None
            await write(self, *args, **kwargs)

        guard_module.Guard._answered = timed_answered  # type: ignore[method-assign]
        JSONRPCDispatcher._write_result = timed_write  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        guard_module.Guard._answered, JSONRPCDispatcher._write_result = self._originals  # type: ignore[method-assign]


async def _calls(store: KeyStore, calls: int) -> list[float]:
    server = MCPServer("window")

    @server.tool()
    async def hit(n: int) -> str:
        return str(n)

    install(server, store)
    with _Gaps() as timed:
        async with Client(server, mode="legacy") as client:
            await client.list_tools()
            for n in range(calls):
                await client.call_tool("hit", {"n": n})  # keyless: a derived key each
    await store.aclose()
    return timed.gaps


def _summary(gaps: list[float]) -> dict[str, float | int]:
    cuts = statistics.quantiles(gaps, n=100)
    return {
        "calls": len(gaps),
        "p50_us": round(cuts[49] * 1e6, 1),
        "p99_us": round(cuts[98] * 1e6, 1),
        "max_us": round(max(gaps) * 1e6, 1),
    }


def measure(scale: Scale) -> dict[str, Any]:
    calls = max(200, scale.overhead_calls * 10)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("memory", "sqlite"):
            store: KeyStore = (
                MemoryKeyStore() if name == "memory" else SQLiteKeyStore(Path(tmp) / "keys.db")
            )
            out[name] = _summary(run_async(scale, _calls, store, calls))
    return out


if __name__ == "__main__":
    standalone(__doc__, measure)
