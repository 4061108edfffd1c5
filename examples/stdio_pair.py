"""Client and server over stdio: `uv run python examples/stdio_pair.py [--store URL]`.

The client spawns `examples/server.py --stdio` itself. If that process dies, `connect` spawns
another and the call is retried with the same key; with a durable store (the default SQLite file,
or Redis) the new process replays what the old one stored instead of running the tool again.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from orchestrator import RetryingSession

SERVER = Path(__file__).with_name("server.py")


async def main(store: str) -> None:
    # The child gets a minimal environment: pass the store on its command line.
    params = StdioServerParameters(
        command=sys.executable, args=[str(SERVER), "--stdio", "--store", store]
    )

    def connect() -> Client:
        return Client(params)  # a new server process per session

    async with RetryingSession(connect=connect) as session:
        order = f"order-{uuid.uuid4().hex[:8]}"
        key = f"charge-{order}"
        for label in ("charge", "charge again, same key"):
            result, report = await session.call_tool_with_report(
                "charge", {"order_id": order, "cents": 700}, idempotency_key=key
            )
            status = "replayed" if report.replayed else "executed"
            print(f"{label}: {status} {result.structured_content}")

        result = await session.call_tool("list_charges", {"order_id": order})
        charges = (result.structured_content or {}).get("result", [])
        print(f"charges for {order}: {len(charges)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="sqlite:///.mcp-once/keys.sqlite3")
    anyio.run(main, parser.parse_args().store)
