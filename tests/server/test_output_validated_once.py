"""A guarded tool's output is validated against its output schema once per execution, as
unguarded: the guard converts (and validates) the result before storing it, and `MCPServer`'s
own conversion of the answer the guard hands back does not validate that same content again.
A replay is still validated by the SDK, exactly as without the skip."""

from __future__ import annotations

import itertools

import pytest
from mcp.client import Client
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, ConfigDict, field_validator
from server_kit import marker, meta

from idempotency import MemoryKeyStore, idempotent, install

pytestmark = pytest.mark.anyio

#: Every validation of a `Receipt` (the output schema's model) takes one number from here.
validations = itertools.count()


class Receipt(BaseModel):
    model_config = ConfigDict(revalidate_instances="always")
    cents: int

    @field_validator("cents")
    @classmethod
    def _count(cls, value: int) -> int:
        next(validations)
        return value


def _seen() -> int:
    """How many validations so far (reading takes one number, which is subtracted)."""
    return next(validations)


@pytest.mark.parametrize("wiring", ["decorator", "install"])
async def test_executed_result_validated_once_and_replay_as_the_sdk_does(wiring: str) -> None:
    server = MCPServer("shop")
    store = MemoryKeyStore()

    async def charge(cents: int) -> Receipt:
        return Receipt(cents=cents)

    if wiring == "decorator":
        server.tool()(idempotent(store)(charge))
    else:
        server.tool()(charge)
        install(server, store)

    async def unguarded(cents: int) -> Receipt:
        return Receipt(cents=cents)

    server.tool()(unguarded)
    async with Client(server) as client:
        before = _seen()
        plain = await client.call_tool("unguarded", {"cents": 5})
        per_call = _seen() - before - 1  # what the SDK alone costs an unguarded call
        assert plain.structured_content == {"cents": 5}

        before = _seen()
        first = await client.call_tool("charge", {"cents": 5}, meta=meta("k-1"))
        assert _seen() - before - 1 == per_call  # not one validation more than unguarded
        assert first.structured_content == {"cents": 5}
        assert marker(first)["status"] == "executed"

        before = _seen()
        again = await client.call_tool("charge", {"cents": 5}, meta=meta("k-1"))
        assert marker(again)["status"] == "replayed"
        assert again.structured_content == {"cents": 5}
        assert _seen() - before - 1 == 1  # the replay: validated by the SDK, as before
