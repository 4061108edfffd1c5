"""A client that retries safely: `uv run python examples/client_http.py [URL]`.

It calls the example server's tools (charge, set_shipping_address, list_charges): start that
server first (`uv run mcp-once serve-example`, `uv run python examples/server.py` or
`uv run python examples/fastmcp_server.py`); the URL defaults to http://127.0.0.1:8000/mcp.
"""

from __future__ import annotations

import argparse
import sys
import uuid

import anyio
from mcp import Client

from orchestrator import (
    NotExecuted,
    OutcomeUnknown,
    RetryingSession,
    RetryPolicy,
    streamable_http_transport,
)

DEFAULT_URL = "http://127.0.0.1:8000/mcp"


async def main(url: str) -> None:
    # `connect` opens a fresh session whenever the current one dies (server restart, dropped
    # connection); the retry that follows reuses the call's idempotency key.
    # `streamable_http_transport` keeps HTTP failures (refused, 503 + Retry-After) visible to
    # the retry logic instead of cancelling the call.
    def connect() -> Client:
        return Client(streamable_http_transport(url))

    policy = RetryPolicy(max_attempts=5, deadline=30.0)
    async with RetryingSession(connect=connect, policy=policy) as session:
        order = f"order-{uuid.uuid4().hex[:8]}"

        # One logical payment, one key. Retries of a lost answer are made by RetryingSession
        # itself; here we also re-send it by hand, as a client restarted after a crash would.
        key = f"charge-{order}"
        for label in ("charge", "charge again, same key"):
            result, report = await session.call_tool_with_report(
                "charge", {"order_id": order, "cents": 1250}, idempotency_key=key
            )
            status = "replayed" if report.replayed else "executed"
            print(f"{label}: {status} {result.structured_content} attempts={len(report.attempts)}")

        # Naturally idempotent; no key given: RetryingSession mints one per call.
        result, report = await session.call_tool_with_report(
            "set_shipping_address", {"order_id": order, "address": "1 Main St"}
        )
        print(f"set_shipping_address: {'replayed' if report.replayed else 'executed'}")

        # Read-only: retried on failure on the strength of `readOnlyHint` alone.
        result = await session.call_tool("list_charges", {"order_id": order})
        charges = (result.structured_content or {}).get("result", [])
        print(f"charges for {order}: {len(charges)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[1])
    parser.add_argument("url", nargs="?", default=DEFAULT_URL, help="default: %(default)s")
    url = parser.parse_args().url
    try:
        anyio.run(main, url)
    except (OutcomeUnknown, NotExecuted) as stopped:
        # What a caller does with a call that ended without a result: NotExecuted, safe to send
        # again later with the same key; OutcomeUnknown, reconcile using the key (docs/client.md).
        print(f"{type(stopped).__name__}: {stopped}", file=sys.stderr)
        if isinstance(stopped, NotExecuted):
            print("Is the example server running? `uv run mcp-once serve-example`", file=sys.stderr)
        sys.exit(1)
