"""Every row of the contract's error table, produced through a real MCP session, with its code,
its `data` and a sentence in `message`; and bad stored data answered clearly, losing nothing."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from fake_clock import FakeClock
from mcp import MCPError
from mcp.client import Client
from server_kit import (
    SOON,
    DownStore,
    Effects,
    body,
    call_fingerprint,
    effect_server,
    marker,
    meta,
    record_key,
)

from idempotency import (
    CorruptRecord,
    KeyStore,
    MemoryKeyStore,
    RedisKeyStore,
    StoreUnavailable,
    wire,
)
from idempotency._guard.keyplaces import META_PLACE, FoundKey
from idempotency._guard.mint import resolve_key

pytestmark = pytest.mark.anyio

ARGS: dict[str, Any] = {"order": "o", "cents": 1}


def assert_sentence(error: MCPError) -> None:
    assert error.message.endswith(".") and len(error.message.split()) >= 6, error.message


@asynccontextmanager
async def first_call_holding(client: Client, effects: Effects, key: str) -> AsyncIterator[None]:
    """A first call with `key` that holds inside the tool while the block runs, then finishes."""
    async with anyio.create_task_group() as tg:

        async def first() -> None:
            await client.call_tool("charge", ARGS, meta=meta(key))

        tg.start_soon(first)
        await effects.started.wait()
        yield
        effects.open()


async def refused(client: Client, key: object, args: dict[str, Any] = ARGS) -> MCPError:
    with pytest.raises(MCPError) as caught:
        await client.call_tool("charge", args, meta=meta(key))
    assert_sentence(caught.value)
    return caught.value


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        (42, "must be a string, not int"),
        (True, "must be a string, not bool"),
        (["k"], "must be a string, not list"),
        ("", "must not be empty"),
        ("k" * 256, "at most 255"),
        ("bad\x00key", "printable ASCII"),
        ("tab\tkey", "printable ASCII"),
        ("clé", "printable ASCII"),
    ],
    ids=["int", "bool", "list", "empty", "too-long", "nul", "tab", "non-ascii"],
)
async def test_malformed_key_is_invalid_params(key: object, reason: str) -> None:
    effects = Effects()
    server = effect_server(MemoryKeyStore(), effects, gated=False)
    async with Client(server) as client:
        error = await refused(client, key)
    assert error.code == wire.INVALID_PARAMS
    assert reason in error.error.data["reason"]
    if isinstance(key, str) and len(key) <= wire.MAX_KEY_LENGTH:
        assert error.error.data["key"] == key
    else:
        assert "key" not in error.error.data
    assert effects.count == 0


def test_null_key_is_malformed_not_missing() -> None:
    """A JSON null never leaves the SDK's client (it drops None values from `_meta`), so this
    shape is checked where the server reads the key."""
    with pytest.raises(MCPError) as caught:
        resolve_key([FoundKey(META_PLACE, None)], "derived", lambda: "unused")
    assert caught.value.code == wire.INVALID_PARAMS
    assert "not NoneType" in caught.value.error.data["reason"]


async def test_missing_key_where_required_is_invalid_params() -> None:
    effects = Effects()
    server = effect_server(MemoryKeyStore(), effects, gated=False, keys="required")
    async with Client(server) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("charge", ARGS)
        keyed = await client.call_tool("charge", ARGS, meta=meta("present"))
    assert caught.value.code == wire.INVALID_PARAMS
    assert caught.value.error.data == {"reason": "missing"}
    assert wire.KEY_META in caught.value.message
    assert effects.count == 1
    assert marker(keyed)["status"] == "executed"


async def test_key_reused_with_other_arguments_before_and_after_completion(
    store: KeyStore,
) -> None:
    effects = Effects()
    server = effect_server(store, effects)
    with anyio.fail_after(SOON):
        async with Client(server) as client:
            async with anyio.create_task_group() as tg:

                async def first() -> None:
                    await client.call_tool("charge", ARGS, meta=meta("reuse"))

                tg.start_soon(first)
                await effects.started.wait()
                during = await refused(client, "reuse", {"order": "o", "cents": 2})
                effects.open()
            after = await refused(client, "reuse", {"order": "other", "cents": 1})
    for error in (during, after):
        assert error.code == wire.KEY_REUSED
        assert error.error.data == {"key": "reuse"}
    assert effects.count == 1


async def test_in_progress_without_wait_carries_retry_hint(store: KeyStore) -> None:
    effects = Effects()
    server = effect_server(store, effects, wait=0)
    with anyio.fail_after(SOON):
        async with Client(server) as client:
            async with first_call_holding(client, effects, "busy"):
                error = await refused(client, "busy")
            replay = await client.call_tool("charge", ARGS, meta=meta("busy"))
    assert error.code == wire.IN_PROGRESS
    assert error.error.data["key"] == "busy"
    retry_after = error.error.data["retryAfterMs"]
    assert isinstance(retry_after, int) and 0 < retry_after <= 1000
    assert effects.count == 1
    assert marker(replay)["status"] == "replayed"


async def test_in_progress_after_a_bounded_wait() -> None:
    effects = Effects()
    server = effect_server(MemoryKeyStore(), effects, wait=0.05)
    with anyio.fail_after(SOON):
        async with Client(server) as client, first_call_holding(client, effects, "slow"):
            started = anyio.current_time()
            error = await refused(client, "slow")
            waited = anyio.current_time() - started
    assert error.code == wire.IN_PROGRESS
    assert waited >= 0.05
    assert effects.count == 1


async def test_expired_lease_is_outcome_unknown_under_default_policy() -> None:
    """A worker claimed the key and vanished (its claim made directly in the store)."""
    clock = FakeClock()
    store = MemoryKeyStore(clock=clock)
    effects = Effects()
    server = effect_server(store, effects, gated=False, lease=5)
    crashed = await store.claim(
        record_key("shop", "charge", "lost"),
        call_fingerprint("charge", ARGS),
        lease=5,
        takeover=False,
    )
    assert crashed.token is not None
    clock.now += 6
    async with Client(server) as client:
        error = await refused(client, "lost")
        again = await refused(client, "lost")
    assert error.code == again.code == wire.OUTCOME_UNKNOWN
    assert error.error.data == {"key": "lost"}
    assert effects.count == 0


async def test_expired_lease_is_taken_over_by_a_naturally_idempotent_tool() -> None:
    clock = FakeClock()
    store = MemoryKeyStore(clock=clock)
    effects = Effects()
    server = effect_server(store, effects, gated=False, lease=5, naturally_idempotent=True)
    await store.claim(
        record_key("shop", "charge", "lost"),
        call_fingerprint("charge", ARGS),
        lease=5,
        takeover=True,
    )
    clock.now += 6
    async with Client(server) as client:
        result = await client.call_tool("charge", ARGS, meta=meta("lost"))
    assert effects.count == 1
    assert marker(result)["status"] == "executed"
    assert marker(result)["attempts"] == 2


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("kind", ["failing", "redis-without-server"])
async def test_store_unavailable_does_not_run_the_tool(kind: str) -> None:
    store: KeyStore
    if kind == "failing":
        store = DownStore()
    else:
        store = RedisKeyStore.from_url(f"redis://127.0.0.1:{closed_port()}/0", socket_timeout=2)
    effects = Effects()
    server = effect_server(store, effects, gated=False)
    try:
        # One in-memory connection: a caller to bind a derived key to.
        async with Client(server, mode="legacy") as client:
            keyed = await refused(client, "k")
            with pytest.raises(MCPError) as keyless:
                await client.call_tool("charge", ARGS)  # a derived key needs the store as well
    finally:
        await store.aclose()
    assert keyed.code == keyless.value.code == wire.STORE_UNAVAILABLE
    assert keyed.error.data == {"key": "k"}
    assert keyless.value.error.data["key"].startswith("derived-")
    assert effects.count == 0


class FailsOnceBusy(MemoryKeyStore):
    """Reachable until a claim finds the key held by another attempt; from then on the store is
    gone: `wait` fails, or (`fail="claim"`) `wait` ends at once and the next claim fails."""

    def __init__(self, fail: str) -> None:
        super().__init__()
        self.fail = fail
        self.gone = False

    async def claim(
        self, key: str, fingerprint: str, *, lease: float, takeover: bool, tool: str | None = None
    ) -> Any:
        if self.gone:
            raise StoreUnavailable("connection refused")
        outcome = await super().claim(key, fingerprint, lease=lease, takeover=takeover, tool=tool)
        self.gone = outcome.status.value == "busy"
        return outcome

    async def wait(self, key: str, *, timeout: float) -> Any:
        if self.fail == "wait":
            raise StoreUnavailable("connection refused")
        return None


@pytest.mark.parametrize("fail", ["wait", "claim"])
async def test_a_store_failing_while_another_attempt_holds_the_key_is_in_progress(
    fail: str,
) -> None:
    """A duplicate found the key held by a running attempt, then lost the store. It must not
    say STORE_UNAVAILABLE ("the tool was not run": the other attempt is running it), and must not
    run the tool unprotected even under `fail_open`: it answers IN_PROGRESS."""
    store = FailsOnceBusy(fail)
    effects = Effects()
    server = effect_server(store, effects, fail_open=True)
    with anyio.fail_after(SOON):
        async with Client(server) as client, first_call_holding(client, effects, "held"):
            duplicate = await refused(client, "held")
            store.gone = False
    assert duplicate.code == wire.IN_PROGRESS
    assert duplicate.error.data["key"] == "held" and duplicate.error.data["retryAfterMs"] > 0
    assert effects.count == 1


async def test_fail_open_runs_unprotected_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    effects = Effects()
    server = effect_server(DownStore(), effects, gated=False, fail_open=True)
    async with Client(server) as client:
        result = await client.call_tool("charge", ARGS, meta=meta("k"))
    assert effects.count == 1
    assert wire.IDEMPOTENCY_META not in (result.meta or {})
    assert any("UNPROTECTED" in r.getMessage() for r in caplog.records)


async def test_corrupted_record_is_a_clear_error_and_left_untouched() -> None:
    store = MemoryKeyStore()
    effects = Effects()
    server = effect_server(store, effects, gated=False)
    name = record_key("shop", "charge", "damaged")
    claim = await store.claim(name, call_fingerprint("charge", ARGS), lease=5, takeover=False)
    assert claim.token is not None
    assert await store.complete(name, claim.token, b"\xff not a stored result", retention=60)
    async with Client(server) as client:
        error = await refused(client, "damaged")
    assert error.code == wire.CORRUPT_RECORD
    assert error.error.data == {"key": "damaged"}
    assert "operator" in error.message
    record = await store.get(name)
    assert record is not None and record.result == b"\xff not a stored result"
    assert effects.count == 0


class CorruptStore(MemoryKeyStore):
    async def claim(
        self, key: str, fingerprint: str, *, lease: float, takeover: bool, tool: str | None = None
    ) -> Any:
        raise CorruptRecord(key, "unexpected field")


async def test_store_reporting_a_corrupt_record_is_a_clear_error() -> None:
    effects = Effects()
    server = effect_server(CorruptStore(), effects, gated=False)
    async with Client(server) as client:
        error = await refused(client, "k")
    assert error.code == wire.CORRUPT_RECORD
    assert error.error.data == {"key": "k"}
    assert effects.count == 0


@pytest.mark.parametrize("limit_at", ["policy", "store"])
async def test_result_too_large_is_answered_once_and_never_rerun(limit_at: str) -> None:
    store = MemoryKeyStore(max_result_bytes=600) if limit_at == "store" else MemoryKeyStore()
    options: dict[str, Any] = {"max_result_bytes": 600} if limit_at == "policy" else {}
    effects = Effects()
    server = effect_server(store, effects, gated=False, **options)
    big = {"order": "x" * 2000, "cents": 1}
    async with Client(server) as client:
        first = await client.call_tool("charge", big, meta=meta("big"))
        retry = await client.call_tool("charge", big, meta=meta("big"))
    assert effects.count == 1
    assert marker(first)["status"] == "executed"
    assert body(first)["content"][0]["text"].startswith("charged 1 for xxx")
    assert marker(retry)["status"] == "replayed"
    assert retry.is_error is True
    assert "larger than the 600 bytes" in body(retry)["content"][0]["text"]
    assert "will not run again" in body(retry)["content"][0]["text"]
