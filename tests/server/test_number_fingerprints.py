"""Fingerprints compare JSON numbers by value (issue 43, item 10): `20` and `20.0` are one JSON
number (RFC 8785 writes both `20`), and clients differ in which they send (JavaScript never writes
`20.0`; Python's `json` does). A record written before, which holds the fingerprint of the float
as it was written, still replays for a retry that sends the same arguments.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from mcp import MCPError
from mcp.client import Client
from mcp_types import CallToolResult, TextContent
from server_kit import Effects, effect_server, marker, meta, record_key

from idempotency import MemoryKeyStore, encode_result, fingerprint, wire
from idempotency._guard.fingerprint import canonical_json, fingerprints

pytestmark = pytest.mark.anyio


def legacy(tool: str, arguments: dict[str, Any]) -> str:
    """The fingerprint as records written before numbers compared by value hold it."""
    return hashlib.sha256(canonical_json({"tool": tool, "arguments": arguments})).hexdigest()


def test_numbers_are_fingerprinted_by_value() -> None:
    same = [
        ({"duration": 20}, {"duration": 20.0}),
        ({"n": {"deep": [1, 2.0, {"x": -0.0}]}}, {"n": {"deep": [1.0, 2, {"x": 0}]}}),
        ({"big": 10**16}, {"big": 1e16}),
        ({"big": 123456789012345678901234567890}, {"big": 123456789012345678901234567890}),
    ]
    for one, other in same:
        assert fingerprint("t", one) == fingerprint("t", other), (one, other)
    different = [
        ({"duration": 20}, {"duration": 20.5}),
        ({"duration": 20}, {"duration": "20"}),
        ({"s": "20.0"}, {"s": "20"}),  # strings are compared as written
        ({"id": 9007199254740993}, {"id": 9007199254740992}),  # integers stay exact
        ({"flag": True}, {"flag": 1}),
    ]
    for one, other in different:
        assert fingerprint("t", one) != fingerprint("t", other), (one, other)


def test_the_legacy_fingerprint_is_given_only_where_it_differs() -> None:
    """The old form is asked for only when the call has an integral float: otherwise the bytes
    are the same, and so is the one fingerprint."""
    plain = {"order": "o.0-1", "cents": 500, "rate": 0.25, "note": "e+1 20.0"}
    assert fingerprints("t", plain) == (legacy("t", plain), None)
    floaty = {"order": "o-1", "duration": 20.0}
    by_value, old = fingerprints("t", floaty)
    assert old == legacy("t", floaty) and by_value == legacy("t", {"order": "o-1", "duration": 20})
    huge = {"n": 1e300}
    assert fingerprints("t", huge)[1] == legacy("t", huge)


async def test_20_and_20_0_are_one_call() -> None:
    """The same key with `cents: 20` and then `cents: 20.0` is a retry: replayed, not -32011."""
    effects = Effects()
    server = effect_server(MemoryKeyStore(), effects, gated=False)
    async with Client(server, mode="legacy") as client:
        first = await client.call_tool("charge", {"order": "o", "cents": 20}, meta=meta("k"))
        again = await client.call_tool("charge", {"order": "o", "cents": 20.0}, meta=meta("k"))
        with pytest.raises(MCPError) as other:
            await client.call_tool("charge", {"order": "o", "cents": 21.0}, meta=meta("k"))
    assert marker(first)["status"] == "executed" and marker(again)["status"] == "replayed"
    assert other.value.code == wire.KEY_REUSED
    assert effects.count == 1


async def test_a_record_written_before_still_replays_for_its_retry() -> None:
    """A record completed under the old fingerprint of `cents: 20.0` (as written): the retry
    that sends `20.0` again replays it; other arguments are still -32011, and the tool never
    runs."""
    effects = Effects()
    store = MemoryKeyStore()
    arguments = {"order": "o", "cents": 20.0}
    key = record_key("shop", "charge", "k-old")
    claimed = await store.claim(key, legacy("charge", arguments), lease=30, takeover=False)
    assert claimed.token is not None
    stored = CallToolResult(
        content=[TextContent(type="text", text="charged 20 for o (before the upgrade)")],
        structured_content={"result": "charged 20 for o (before the upgrade)"},
    )
    assert await store.complete(key, claimed.token, encode_result(stored, 1.0), retention=600)
    server = effect_server(store, effects, gated=False)
    async with Client(server, mode="legacy") as client:
        replay = await client.call_tool("charge", arguments, meta=meta("k-old"))
        with pytest.raises(MCPError) as other:
            await client.call_tool("charge", {"order": "o", "cents": 21.0}, meta=meta("k-old"))
    assert marker(replay)["status"] == "replayed"
    assert replay.structured_content == {"result": "charged 20 for o (before the upgrade)"}
    assert other.value.code == wire.KEY_REUSED
    assert effects.count == 0
