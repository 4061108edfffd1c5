"""The choices FastMCP forces on the middleware, one test each: which tools, what happens below the
guard (validation, unknown tools, effect-free errors, FastMCP's `timeout=`), task-capable tools,
input rounds, mounted and proxied servers, and the order against FastMCP's caching and rate
limiting middleware."""

from __future__ import annotations

from typing import Any

import pytest
from fake_clock import FakeClock
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server import create_proxy
from fastmcp.server.middleware.caching import ResponseCachingMiddleware
from fastmcp.server.middleware.rate_limiting import RateLimitingMiddleware
from fastmcp_kit import charge_server, promise, serving
from mcp import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
    ToolAnnotations,
)
from server_kit import Effects, answer, body, marker, meta, record_key
from task_kit import InProcessTasks

from idempotency import (
    Claim,
    KeyStore,
    MemoryKeyStore,
    OutcomeLost,
    RecordState,
    current_claim,
    parse_history,
    wire,
)
from idempotency.fastmcp import IdempotencyMiddleware

pytestmark = pytest.mark.anyio

ARGS: dict[str, Any] = {"order": "o-1", "cents": 500}


async def records(store: KeyStore) -> list[Any]:
    return list(await store.list_records())


# -- which tools ---------------------------------------------------------------------------------


def shop(store: KeyStore, runs: list[str], **options: Any) -> FastMCP[Any]:
    server: FastMCP[Any] = FastMCP("shop")
    server.add_middleware(IdempotencyMiddleware(store, **options))

    @server.tool(tags={"money"})
    async def pay(order: str) -> str:
        runs.append("pay")
        return f"paid {order}"

    @server.tool
    async def ship(order: str) -> str:
        runs.append("ship")
        return f"shipped {order}"

    @server.tool
    async def note(order: str) -> str:
        runs.append("note")
        return f"noted {order}"

    return server


@pytest.mark.parametrize(
    ("options", "guarded"),
    [
        ({}, {"pay", "ship", "note"}),
        ({"tools": ["ship"]}, {"ship"}),
        ({"tags": {"money"}}, {"pay"}),
        ({"tools": ["note"], "tags": ["money"]}, {"pay", "note"}),
    ],
    ids=["all", "by-name", "by-tag", "both"],
)
async def test_the_chosen_tools_are_guarded_and_listed_so(
    options: dict[str, Any], guarded: set[str]
) -> None:
    runs: list[str] = []
    server = shop(MemoryKeyStore(), runs, **options)
    async with serving(server, "memory") as connect, connect() as client:
        listed = {t.name: promise(t) for t in await client.list_tools()}
        results = {
            name: [await client.call_tool_mcp(name, {"order": "a"}, meta=meta(name)) for _ in "12"]
            for name in ("pay", "ship", "note")
        }
    for name, (first, second) in results.items():
        if name in guarded:
            assert listed[name] == (True, {"keys": "derived", "retentionSeconds": 86400})
            assert marker(second)["status"] == "replayed" and runs.count(name) == 1
        else:
            # Not chosen: listed as registered, run as written, and no marker claims otherwise.
            assert listed[name] == (None, None)
            assert wire.IDEMPOTENCY_META not in (second.meta or {}) and runs.count(name) == 2
            assert body(first) == body(second)


def test_tools_must_be_a_collection_of_names() -> None:
    with pytest.raises(TypeError, match="not one string"):
        IdempotencyMiddleware(MemoryKeyStore(), tools="pay")


# -- below the guard -----------------------------------------------------------------------------


class Declined(Exception):
    """The provider refused before charging (declared effect-free)."""


def failing(store: KeyStore | None, exc: Exception, attempts: list[int], **options: Any) -> Any:
    server: FastMCP[Any] = FastMCP("shop")
    if store is not None:
        server.add_middleware(IdempotencyMiddleware(store, **options))

    @server.tool
    async def pay(order: str, cents: int) -> str:
        attempts.append(cents)
        if len(attempts) == 1:
            raise exc
        return f"paid {cents} for {order} on try {len(attempts)}"

    return server


@pytest.mark.parametrize(
    "exc", [RuntimeError("db password"), ToolError("card expired")], ids=["crash", "tool-error"]
)
async def test_a_body_error_is_stored_as_fastmcp_renders_it(exc: Exception) -> None:
    attempts: list[int] = []
    store = MemoryKeyStore()
    async with serving(failing(store, exc, attempts), "memory") as connect, connect() as client:
        first = await client.call_tool_mcp("pay", ARGS, meta=meta("e1"))
        retry = await client.call_tool_mcp("pay", ARGS, meta=meta("e1"))
    reference_attempts: list[int] = []
    plain = failing(None, exc, reference_attempts)
    async with serving(plain, "memory") as connect, connect() as client:
        reference = await client.call_tool_mcp("pay", ARGS)
    assert attempts == [500]
    assert first.is_error is True and body(first) == body(reference)
    assert marker(retry)["status"] == "replayed" and answer(retry) == answer(first)


async def test_an_effect_free_error_releases_the_claim() -> None:
    attempts: list[int] = []
    server = failing(MemoryKeyStore(), Declined("try later"), attempts, effect_free=Declined)
    async with serving(server, "memory") as connect, connect() as client:
        first = await client.call_tool_mcp("pay", ARGS, meta=meta("e2"))
        retry = await client.call_tool_mcp("pay", ARGS, meta=meta("e2"))
    assert first.is_error is True and wire.IDEMPOTENCY_META not in (first.meta or {})
    assert body(retry)["content"][0]["text"] == "paid 500 for o-1 on try 2"
    assert marker(retry)["status"] == "executed" and marker(retry)["attempts"] == 2


async def test_refusals_before_the_body_release_the_claim() -> None:
    """Invalid arguments and unknown tools: FastMCP answers as it would, and the key stays free."""
    effects = Effects()
    store = MemoryKeyStore()
    server = charge_server(store, effects, gated=False)
    plain = charge_server(None, Effects(), gated=False)
    bad = {"order": "o-1", "cents": "many"}
    async with serving(server, "memory") as connect, connect() as client:
        invalid = await client.call_tool_mcp("charge", bad, meta=meta("v"))
        unknown = await client.call_tool_mcp("refund", ARGS, meta=meta("u"))
        assert await records(store) == []
        valid = await client.call_tool_mcp("charge", ARGS, meta=meta("v"))
    async with serving(plain, "memory") as connect, connect() as client:
        reference = await client.call_tool_mcp("charge", bad)
    assert invalid.is_error is True and body(invalid) == body(reference)
    assert unknown.is_error is True
    assert body(unknown)["content"][0]["text"] == "Unknown tool: 'refund'"
    assert marker(valid)["status"] == "executed" and effects.count == 1


def timed_shop(store: KeyStore, effects: Effects, **annotations: Any) -> FastMCP[Any]:
    server: FastMCP[Any] = FastMCP("shop")
    server.add_middleware(IdempotencyMiddleware(store, lease=5, wait=0))

    @server.tool(timeout=0.2, annotations=ToolAnnotations(**annotations))
    async def charge(order: str, cents: int) -> str:
        return await effects.charge(order, cents, gated=not effects.gate.is_set())

    return server


async def test_a_fastmcp_timeout_is_outcome_unknown_never_a_stored_error() -> None:
    """FastMCP cancels the body at `timeout=` and would report "timed out": storing that would
    replay it forever for an effect that may have happened. It answers -32012 instead, as for the
    guard's own `max_run_time`, and the record waits for its lease."""
    clock = FakeClock()
    store = MemoryKeyStore(clock=clock)
    effects = Effects()
    errors: list[MCPError] = []
    async with serving(timed_shop(store, effects), "memory") as connect, connect() as client:
        for advance in (0, 0, 60):
            clock.now += advance
            with pytest.raises(MCPError) as caught:
                await client.call_tool_mcp("charge", ARGS, meta=meta("slow"))
            errors.append(caught.value)
    first, during_lease, after_lease = (e.code for e in errors)
    assert first == wire.OUTCOME_UNKNOWN and "timeout FastMCP enforces" in errors[0].message
    assert during_lease == wire.IN_PROGRESS
    assert after_lease == wire.OUTCOME_UNKNOWN
    assert effects.cancelled == 1 and effects.count == 0  # the body ran once, and never again
    (record,) = await records(store)
    assert record.state is RecordState.UNKNOWN


@pytest.mark.parametrize("takeover", [False, True], ids=["unknown-at-once", "left-to-lease"])
async def test_a_tool_that_lost_its_outcome_turns_the_record_unknown_at_once(
    takeover: bool,
) -> None:
    """`OutcomeLost` (its downstream call may have had its effect and will never say): -32012,
    and the record UNKNOWN at once (`interrupted` in its history), so a re-send within the lease
    gets -32012, not -32010, and the body never runs again. A tool that allows a takeover is
    left to its lease, as a cut-off one is: -32010 until the next claim after it runs it again."""
    store = MemoryKeyStore()
    runs: list[int] = []
    server: FastMCP[Any] = FastMCP("shop")
    server.add_middleware(IdempotencyMiddleware(store, lease=30, wait=0, takeover=takeover))

    @server.tool
    async def charge(order: str) -> str:
        runs.append(1)
        raise OutcomeLost("the payment provider's connection broke after the request")

    async with serving(server, "memory") as connect, connect() as client:
        codes = []
        for _ in range(2):
            with pytest.raises(MCPError) as caught:
                await client.call_tool_mcp("charge", {"order": "o-1"}, meta=meta("lost"))
            codes.append(caught.value.code)
    (record,) = await records(store)
    history = [e.kind for e in parse_history(await store.history(record.key))]
    assert runs == [1]
    if takeover:
        assert codes == [wire.IN_PROGRESS, wire.IN_PROGRESS]
        assert record.state is RecordState.IN_PROGRESS and history == ["claimed", "refused"]
    else:
        assert codes == [wire.OUTCOME_UNKNOWN, wire.OUTCOME_UNKNOWN]
        assert record.state is RecordState.UNKNOWN
        assert history == ["claimed", "interrupted", "refused"]


async def test_a_timed_out_naturally_idempotent_tool_is_taken_over() -> None:
    clock = FakeClock()
    store = MemoryKeyStore(clock=clock)
    effects = Effects()
    server = timed_shop(store, effects, idempotent_hint=True)
    async with serving(server, "memory") as connect, connect() as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool_mcp("charge", ARGS, meta=meta("slow"))
        clock.now += 60
        effects.open()
        again = await client.call_tool_mcp("charge", ARGS, meta=meta("slow"))
    assert caught.value.code == wire.IN_PROGRESS
    assert marker(again)["status"] == "executed" and marker(again)["attempts"] == 2
    assert effects.cancelled == 1 and effects.count == 1


async def test_a_tool_with_a_timeout_that_finishes_in_time_is_stored_and_replayed() -> None:
    effects = Effects()
    effects.open()
    server = timed_shop(MemoryKeyStore(), effects)
    async with serving(server, "memory") as connect, connect() as client:
        first = await client.call_tool_mcp("charge", ARGS, meta=meta("quick"))
        replay = await client.call_tool_mcp("charge", ARGS, meta=meta("quick"))
    assert effects.count == 1 and answer(replay) == answer(first)


# -- task-capable tools --------------------------------------------------------------------------


async def test_a_task_capable_tool_called_in_the_foreground_is_guarded_like_any() -> None:
    """A `task=True` tool called without the tasks extension runs in the foreground: guarded
    and listed as guarded like every tool (its task-augmented calls: `test_fastmcp_tasks.py`)."""
    store = MemoryKeyStore()
    effects = Effects()
    server = charge_server(store, effects, gated=False)
    server.add_extension(InProcessTasks())
    crunched: list[int] = []

    @server.tool(task=True)
    async def crunch(rows: int) -> str:
        crunched.append(rows)
        return f"crunched {rows}"

    async with serving(server, "memory") as connect, connect() as client:
        listed = {t.name: promise(t) for t in await client.list_tools()}
        results = [await client.call_tool_mcp("crunch", {"rows": 3}, meta=meta("t")) for _ in "12"]
    assert listed["crunch"] == listed["charge"] and listed["crunch"][1] is not None
    statuses = [(r.meta or {})[wire.IDEMPOTENCY_META]["status"] for r in results]
    assert crunched == [3] and statuses == ["executed", "replayed"]
    assert len(await records(store)) == 1


# -- input rounds --------------------------------------------------------------------------------


async def test_an_input_round_is_never_stored() -> None:
    """2026-07-28: the question round releases its claim; the completing round is the key's
    answer, and a re-sent completing round replays it."""
    store = MemoryKeyStore()
    server: FastMCP[Any] = FastMCP("survey")
    server.add_middleware(IdempotencyMiddleware(store))
    completed: list[str] = []

    @server.tool
    async def survey(topic: str, ctx: Context) -> Any:
        if ctx.input_responses is None:
            form = ElicitRequestFormParams(
                message=f"about {topic}?",
                requested_schema={"type": "object", "properties": {"text": {"type": "string"}}},
            )
            return InputRequiredResult(input_requests={"q": ElicitRequest(params=form)})
        reply = ctx.input_responses["q"]
        assert isinstance(reply, ElicitResult) and reply.content is not None
        completed.append(str(reply.content["text"]))
        return f"{topic}: {reply.content['text']}"

    replies = {"q": ElicitResult(action="accept", content={"text": "yes"})}
    async with serving(server, "memory") as connect, connect() as client:
        question = await client.session.call_tool(
            "survey", {"topic": "tea"}, meta=meta("s"), allow_input_required=True
        )
        assert isinstance(question, InputRequiredResult)
        assert await records(store) == []  # the question was not stored
        rounds = [
            await client.session.call_tool(
                "survey",
                {"topic": "tea"},
                meta=meta("s"),
                input_responses=replies,
                request_state=question.request_state,
            )
            for _ in "12"
        ]
    done, resent = rounds
    assert isinstance(done, CallToolResult) and isinstance(resent, CallToolResult)
    assert body(done)["content"][0]["text"] == "tea: yes" and completed == ["yes"]
    assert marker(done)["status"] == "executed"
    assert marker(resent)["status"] == "replayed" and answer(resent) == answer(done)


# -- mounted and proxied servers -----------------------------------------------------------------


@pytest.mark.parametrize("guard_parent", [True, False], ids=["parent-and-child", "child-only"])
async def test_a_mounted_server_is_guarded_once(guard_parent: bool) -> None:
    store = MemoryKeyStore()
    effects = Effects()
    child = charge_server(store, effects, name="child", gated=False)
    parent: FastMCP[Any] = FastMCP("parent")
    if guard_parent:
        parent.add_middleware(IdempotencyMiddleware(store))
    parent.mount(child, namespace="billing")
    async with serving(parent, "memory") as connect, connect() as client:
        first = await client.call_tool_mcp("billing_charge", ARGS, meta=meta("m"))
        replay = await client.call_tool_mcp("billing_charge", ARGS, meta=meta("m"))
    assert effects.count == 1 and answer(replay) == answer(first)
    # One record, kept by the outermost middleware that chose the tool, under its own names.
    (record,) = await records(store)
    owner = ("parent", "billing_charge") if guard_parent else ("child", "charge")
    assert record.key == record_key(*owner, "m")


async def test_a_tool_calling_another_is_covered_by_the_outer_record() -> None:
    store = MemoryKeyStore()
    effects = Effects()
    server = charge_server(store, effects, gated=False)

    @server.tool
    async def checkout(order: str, ctx: Context) -> str:
        charged = await ctx.fastmcp.call_tool("charge", {"order": order, "cents": 100})
        return f"checked out: {charged.content[0].text}"  # type: ignore[union-attr]

    async with serving(server, "memory") as connect, connect() as client:
        first = await client.call_tool_mcp("checkout", {"order": "o"}, meta=meta("c"))
        replay = await client.call_tool_mcp("checkout", {"order": "o"}, meta=meta("c"))
    assert effects.count == 1 and answer(replay) == answer(first)
    (record,) = await records(store)
    assert record.key == record_key("shop", "checkout", "c")


@pytest.mark.parametrize(
    ("guard_proxy", "guard_backend"),
    [(True, True), (False, True), (True, False)],
    ids=["both", "backend-only", "proxy-only"],
)
async def test_a_proxied_call_is_guarded_once(guard_proxy: bool, guard_backend: bool) -> None:
    """FastMCP's proxy forwards the request `_meta` (the key with it) and the backend's result
    `_meta` (its marker). In one process the backend's middleware sees the call as inside the
    proxy's guarded one, so one record is kept, whichever side guards."""
    store = MemoryKeyStore()
    effects = Effects()
    backend = charge_server(store if guard_backend else None, effects, name="backend", gated=False)
    proxy = create_proxy(backend, name="proxy")
    if guard_proxy:
        proxy.add_middleware(IdempotencyMiddleware(store))
    async with serving(proxy, "memory") as connect, connect() as client:
        (tool,) = await client.list_tools()
        first = await client.call_tool_mcp("charge", ARGS, meta=meta("p"))
        replay = await client.call_tool_mcp("charge", ARGS, meta=meta("p"))
    assert effects.count == 1
    assert marker(replay)["status"] == "replayed" and answer(replay) == answer(first)
    assert promise(tool)[1] is not None
    (record,) = await records(store)
    owner = "proxy" if guard_proxy else "backend"
    assert record.key == record_key(owner, "charge", "p")


# -- order against FastMCP's own middleware ------------------------------------------------------


async def test_caching_in_front_of_the_guard_is_refused() -> None:
    """A cache before the guard would serve one caller's listing to another and one key's marker
    to the next key: every guarded call and listing fails loudly instead, running nothing."""
    effects = Effects()
    server: FastMCP[Any] = FastMCP("shop")
    server.add_middleware(ResponseCachingMiddleware())
    server.add_middleware(IdempotencyMiddleware(MemoryKeyStore()))

    @server.tool
    async def charge(order: str, cents: int) -> str:
        return await effects.charge(order, cents, gated=False)

    async with serving(server, "memory") as connect, connect() as client:
        with pytest.raises(MCPError) as listing:
            await client.list_tools()
        with pytest.raises(MCPError) as calling:
            await client.call_tool_mcp("charge", ARGS, meta=meta("k"))
    for error in (listing.value, calling.value):
        assert error.code == INTERNAL_ERROR
        assert "Add IdempotencyMiddleware first" in error.message
    assert effects.count == 0


async def test_caching_behind_the_guard_keeps_each_callers_listing_and_each_keys_marker() -> None:
    effects = Effects()
    server = charge_server(MemoryKeyStore(), effects, gated=False)
    server.add_middleware(ResponseCachingMiddleware())
    async with (
        serving(server, "http") as connect,
        connect(mode="legacy") as legacy,
        connect() as stateless,
    ):
        # The cache keeps one tools/list; each caller still hears what holds for it.
        assert promise((await legacy.list_tools())[0])[0] is True
        assert promise((await stateless.list_tools())[0])[0] is None
        k1 = await legacy.call_tool_mcp("charge", ARGS, meta=meta("k1"))
        k2 = await legacy.call_tool_mcp("charge", ARGS, meta=meta("k2"))
        k2_again = await legacy.call_tool_mcp("charge", ARGS, meta=meta("k2"))
    # The cache answered k2 (its author chose to cache this tool); each key has its own record.
    assert effects.count == 1
    assert (marker(k1)["key"], marker(k2)["key"]) == ("k1", "k2")
    assert marker(k2_again)["status"] == "replayed" and answer(k2_again) == answer(k2)


@pytest.mark.parametrize("guard_first", [True, False], ids=["guard-outside", "guard-inside"])
async def test_rate_limiting_on_either_side_never_runs_a_rejected_call(guard_first: bool) -> None:
    store = MemoryKeyStore()
    effects = Effects()
    server: FastMCP[Any] = FastMCP("shop")
    limiter = RateLimitingMiddleware(max_requests_per_second=0.001, burst_capacity=1)
    guard = IdempotencyMiddleware(store)
    for middleware in (guard, limiter) if guard_first else (limiter, guard):
        server.add_middleware(middleware)

    @server.tool
    async def charge(order: str, cents: int) -> str:
        return await effects.charge(order, cents, gated=False)

    async with serving(server, "memory") as connect, connect() as client:
        limiter.limiters.clear()  # one request's worth of tokens from here
        await client.list_tools()  # the client validates results against the listed tools
        limiter.limiters.clear()
        first = await client.call_tool_mcp("charge", ARGS, meta=meta("k1"))
        with pytest.raises(MCPError) as limited:
            await client.call_tool_mcp("charge", {**ARGS, "cents": 1}, meta=meta("k2"))
        assert [r.state for r in await records(store)] == [RecordState.COMPLETED]
        limiter.limiters.clear()
        second = await client.call_tool_mcp("charge", {**ARGS, "cents": 1}, meta=meta("k2"))
    assert "Rate limit exceeded" in limited.value.message
    assert effects.count == 2
    assert marker(first)["status"] == marker(second)["status"] == "executed"


# -- the fence for the tool ----------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["memory", "http"])
async def test_current_claim_is_the_tools_fence_under_the_middleware(transport: str) -> None:
    """`idempotency.current_claim()` works in a FastMCP tool as in an `MCPServer` one: the key as
    the client sent it, the record's fence, the execution count; None outside a guarded call."""
    seen: list[Claim | None] = []
    server: FastMCP[Any] = FastMCP("fenced")
    server.add_middleware(IdempotencyMiddleware(MemoryKeyStore(), tools={"pay"}))

    @server.tool
    async def pay(order: str) -> str:
        seen.append(current_claim())
        return f"paid {order}"

    @server.tool
    async def peek(order: str) -> str:
        seen.append(current_claim())
        return order

    async with serving(server, transport) as connect, connect() as client:
        await client.call_tool_mcp("pay", {"order": "o-1"}, meta=meta("fence-1"))
        replay = await client.call_tool_mcp("pay", {"order": "o-1"}, meta=meta("fence-1"))
        await client.call_tool_mcp("peek", {"order": "o-1"}, meta=meta("fence-2"))
    assert marker(replay)["status"] == "replayed"
    claim, unguarded = seen
    assert claim is not None and (claim.key, claim.fence, claim.attempt) == ("fence-1", 1, 1)
    assert unguarded is None
    assert current_claim() is None
