"""Issue #20: a FastMCP server behaves exactly as FastMCP does wherever the guard protects nothing,
only the tool body's own outcome is stored, spans stay FastMCP's, versions and authorization are
FastMCP's, and keyless merging never swallows a deliberate repeat.

The transparency table (`test_a_call_the_guard_passes_through_is_fastmcps_own`) runs every path
on which the guard protects nothing, on every transport that path exists on, through six kinds
of call, against the same server without the middleware; answers, exception types, FastMCP's
spans and FastMCP's log lines are compared field by field.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
import pytest
from fastmcp import Client, Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.auth import AuthContext
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.server.middleware.authorization import AuthMiddleware
from fastmcp.server.sessions import SessionProvider
from fastmcp.tools.base import Tool, ToolResult
from fastmcp_kit import promise, serving
from log_lines import logged
from mcp import MCPError
from mcp_types import CallToolRequestParams, CallToolResult, ToolAnnotations
from opentelemetry.sdk.trace import ReadableSpan
from otel_spans import Shape, recorder, shapes
from pydantic import BaseModel
from server_kit import DownStore, Effects, caller_gave_up, marker, meta

from idempotency import MemoryKeyStore, wire
from idempotency.fastmcp import IdempotencyMiddleware

pytestmark = pytest.mark.anyio

GUARD_SPAN = "mcp-once guard"
ARGS: dict[str, Any] = {"order": "o", "cents": 1}

#: The six kinds of call of the table: (tool, arguments).
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "ok": ("charge", ARGS),
    "invalid-arguments": ("charge", {"order": "o", "cents": "many"}),
    "body-raises": ("fail", {"kind": "value"}),
    "tool-error": ("fail", {"kind": "tool-error"}),
    "tool-timeout": ("slow", {}),
    "unknown-tool": ("nope", {}),
}


def shop(guard: Middleware | None, effects: Effects, *inner: Middleware) -> FastMCP[Any]:
    """The table's server: `charge` (an effect), `fail` (raises), `slow` (outlives its
    `timeout=`), `look` (read-only); `guard` added first, then `inner`."""
    mcp: FastMCP[Any] = FastMCP("shop")
    if guard is not None:
        mcp.add_middleware(guard)
    for middleware in inner:
        mcp.add_middleware(middleware)

    @mcp.tool
    async def charge(order: str, cents: int) -> str:
        return await effects.charge(order, cents, gated=False)

    @mcp.tool
    async def fail(kind: str) -> str:
        if kind == "tool-error":
            raise ToolError("card declined")
        raise ValueError("the bank said no")

    @mcp.tool(timeout=0.05)
    async def slow() -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def look(order: str) -> str:
        effects.count += 1
        return f"looked at {order} (read {effects.count})"

    return mcp


async def wire_outcome(client: Client[Any], name: str, args: dict[str, Any], key: Any) -> Any:
    """A tools/call as the client sees it: the whole result, or the JSON-RPC error."""
    try:
        result = await client.call_tool_mcp(name, args, meta=key)
    except MCPError as exc:
        return ("error", exc.error.code, exc.error.message, exc.error.data)
    return ("result", result.model_dump(by_alias=True, mode="json", exclude_none=True))


async def inproc_outcome(server: FastMCP[Any], name: str, args: dict[str, Any]) -> Any:
    """`FastMCP.call_tool` in process: the `ToolResult`, or the exception's type and text."""
    try:
        result = await server.call_tool(name, args)
    except Exception as exc:
        cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else None
        return ("raised", type(exc).__qualname__, str(exc), cause)
    content = [block.model_dump(mode="json") for block in result.content]
    return ("result", type(result).__name__, content, result.structured_content, result.meta)


@asynccontextmanager
async def caller(server: FastMCP[Any], transport: str) -> AsyncIterator[Callable[..., Any]]:
    """One way of calling `server`: `call(name, args, key_meta)` gives its outcome."""
    if transport == "inproc":

        async def direct(name: str, args: dict[str, Any], key: Any) -> Any:
            return await inproc_outcome(server, name, args)

        yield direct
        return
    stateless = transport == "http-stateless"
    kind = "memory" if transport == "memory" else "http"
    app = {"stateless_http": True} if stateless else {}
    async with serving(server, kind, **app) as connect, connect() as client:

        async def over_wire(name: str, args: dict[str, Any], key: Any) -> Any:
            return await wire_outcome(client, name, args, key)

        yield over_wire


#: Each path on which the guard protects nothing: its middleware, the `_meta` sent, and
#: whether the guard may add its own span and warning (fail-open: it tried to claim).
PATHS: dict[str, tuple[Callable[[], IdempotencyMiddleware], dict[str, Any] | None, bool]] = {
    "keys-optional": (
        lambda: IdempotencyMiddleware(MemoryKeyStore(), keys="optional"),
        None,
        False,
    ),
    "no-caller": (lambda: IdempotencyMiddleware(MemoryKeyStore()), None, False),
    "not-chosen": (
        lambda: IdempotencyMiddleware(MemoryKeyStore(), tools={"other"}),
        meta("k"),
        False,
    ),
    "fail-open": (lambda: IdempotencyMiddleware(DownStore(), fail_open=True), meta("k"), True),
}
TABLE = [
    ("keys-optional", "memory"),
    ("keys-optional", "http"),
    ("keys-optional", "inproc"),
    ("no-caller", "http-stateless"),
    ("no-caller", "inproc"),
    ("not-chosen", "memory"),
    ("not-chosen", "http"),
    ("fail-open", "memory"),
    ("fail-open", "http"),
]


@pytest.mark.parametrize(("path", "transport"), TABLE)
async def test_a_call_the_guard_passes_through_is_fastmcps_own(path: str, transport: str) -> None:
    make, key, guard_speaks = PATHS[path]
    spans = recorder()
    seen: dict[str, dict[str, Any]] = {}
    for guarded in (False, True):
        effects = Effects()
        server = shop(make() if guarded else None, effects)
        async with caller(server, transport) as call:
            for kind, (name, args) in CALLS.items():
                spans.clear()
                with logged("fastmcp", "idempotency") as lines:
                    outcome = await call(name, args, key)
                recorded = spans.get_finished_spans()
                seen.setdefault(kind, {})[str(guarded)] = {
                    "outcome": outcome,
                    # The server's lines (the client's name a random client id).
                    "fastmcp logs": lines.of("fastmcp.server") + lines.of("fastmcp.tools"),
                    "guard logs": lines.of("idempotency"),
                    "spans": [s for s in shapes(recorded) if not s.name.startswith(GUARD_SPAN)],
                    "guard spans": [s for s in recorded if s.name.startswith(GUARD_SPAN)],
                }
        assert effects.count == 1  # "ok" ran its body once, guarded or not
    for kind, runs in seen.items():
        ours, theirs = runs["True"], runs["False"]
        assert ours["outcome"] == theirs["outcome"], kind
        assert ours["fastmcp logs"] == theirs["fastmcp logs"], kind
        assert ours["spans"] == theirs["spans"], kind
        if not guard_speaks or kind == "unknown-tool":
            assert ours["guard logs"] == [] and ours["guard spans"] == [], kind
    # The table is not vacuous: the error kinds are errors, and FastMCP logged them.
    unguarded = {kind: runs["False"]["outcome"] for kind, runs in seen.items()}
    assert unguarded["ok"][0] == "result"
    if transport == "inproc":
        assert unguarded["invalid-arguments"][1] == "ValidationError"
        assert unguarded["tool-timeout"][1] == "ToolError"
        assert unguarded["unknown-tool"][1] == "NotFoundError"
    else:
        assert unguarded["invalid-arguments"][1]["isError"] is True
        assert "validation error" in unguarded["invalid-arguments"][1]["content"][0]["text"]
        assert unguarded["tool-timeout"][1]["isError"] is True
    assert seen["body-raises"]["False"]["fastmcp logs"]


async def test_keyless_in_process_calls_raise_what_fastmcp_raises() -> None:
    """D1, in process: `mcp.call_tool` of a guarded server raises FastMCP's own exceptions
    (the guard's internal `NothingDone` / `Interrupted` never escape)."""
    server = shop(IdempotencyMiddleware(MemoryKeyStore()), Effects())
    for kind, expected in [
        ("invalid-arguments", "ValidationError"),
        ("tool-timeout", "ToolError"),
        ("unknown-tool", "NotFoundError"),
    ]:
        name, args = CALLS[kind]
        outcome = await inproc_outcome(server, name, args)
        assert outcome[:2] == ("raised", expected), kind


# -- D2: only the body's own outcome is stored -------------------------------------------------


class FailsOnce(Middleware):
    """An inner middleware with one transient fault: before the body (`after=False`) or after
    it returned (`after=True`)."""

    def __init__(self, *, after: bool) -> None:
        self.after = after
        self.calls = 0

    async def on_call_tool(
        self,
        context: MiddlewareContext[CallToolRequestParams],
        call_next: CallNext[CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        self.calls += 1
        if self.after:
            result = await call_next(context)
            if self.calls == 1:
                raise RuntimeError("the audit log was unreachable")
            return result
        if self.calls == 1:
            raise RuntimeError("the rate limiter's backend was unreachable")
        return await call_next(context)


@pytest.mark.parametrize("transport", ["memory", "http"])
async def test_a_failure_below_the_guard_before_the_body_is_not_stored(transport: str) -> None:
    """D2: the retry with the same key runs the tool (1 effect), and the failure reaches the
    client exactly as FastMCP answers it unguarded."""
    answers: dict[bool, list[Any]] = {}
    counts: dict[bool, int] = {}
    for guarded in (False, True):
        effects = Effects()
        guard = IdempotencyMiddleware(MemoryKeyStore()) if guarded else None
        server = shop(guard, effects, FailsOnce(after=False))
        async with caller(server, transport) as call:
            answers[guarded] = [await call("charge", ARGS, meta("pay-1")) for _ in "12"]
        counts[guarded] = effects.count
    assert answers[True][0] == answers[False][0]
    assert answers[True][0][:2] == ("error", -32603)
    assert counts == {False: 1, True: 1}
    retried = answers[True][1]
    assert retried[0] == "result" and retried[1]["isError"] is False
    status = retried[1]["_meta"][wire.IDEMPOTENCY_META]["status"]
    assert status == "executed"


async def test_a_failure_below_the_guard_after_the_body_ran_is_the_keys_answer() -> None:
    """The other side of the line: once FastMCP entered the tool, the effect may have happened,
    so an inner middleware failing on the way out is stored, and the retry is replayed."""
    effects = Effects()
    server = shop(IdempotencyMiddleware(MemoryKeyStore()), effects, FailsOnce(after=True))
    async with serving(server, "memory") as connect, connect() as client:
        first = await client.call_tool_mcp("charge", ARGS, meta=meta("pay-2"))
        retry = await client.call_tool_mcp("charge", ARGS, meta=meta("pay-2"))
    assert effects.count == 1
    assert first.is_error is True and marker(first)["status"] == "executed"
    assert marker(retry)["status"] == "replayed"


# -- D3: spans -----------------------------------------------------------------------------------


def server_spans(found: list[Shape]) -> list[Shape]:
    return [s for s in found if s.kind == "SERVER" and s.name.startswith("tools/call")]


def labels(spans: tuple[ReadableSpan, ...]) -> dict[str, Any]:
    """The tools/call SERVER span's attributes that do not vary between runs."""
    (span,) = [s for s in spans if s.kind.name == "SERVER" and s.name.startswith("tools/call")]
    return {k: v for k, v in (span.attributes or {}).items() if k != "mcp.session.id"}


@pytest.mark.parametrize("transport", ["memory", "http"])
async def test_a_guarded_call_has_one_server_span_with_the_guards_under_it(transport: str) -> None:
    """D3: executed and replayed alike, FastMCP's request span is the one SERVER span, labelled
    as FastMCP labels it unguarded, and the guard's span is its child."""
    spans = recorder()
    attributes: list[dict[str, Any]] = []
    found_shapes: list[list[Shape]] = []
    for guard in (None, IdempotencyMiddleware(MemoryKeyStore())):
        async with serving(shop(guard, Effects()), transport) as connect, connect() as client:
            for _ in "12":
                spans.clear()
                await client.call_tool_mcp("charge", ARGS, meta=meta("span-1"))
                attributes.append(labels(spans.get_finished_spans()))
                found_shapes.append(shapes(spans.get_finished_spans()))
    assert attributes[2] == attributes[3] == attributes[0]  # executed, replayed, unguarded
    assert attributes[0]["fastmcp.component.key"] == "tool:charge@"
    executed, replayed = found_shapes[2:]
    for found in (executed, replayed):
        (server,) = server_spans(found)  # exactly one SERVER span per tools/call: FastMCP's
        assert (server.name, server.status) == ("tools/call charge", "UNSET")
        guard = [s for s in found if s.name.startswith(GUARD_SPAN)]
        assert guard == [Shape(f"{GUARD_SPAN} charge", "INTERNAL", "UNSET", "tools/call charge")]


@pytest.mark.parametrize("transport", ["memory", "http", "inproc"])
async def test_an_unknown_tool_keeps_fastmcps_error_span(transport: str) -> None:
    spans = recorder()
    found: dict[bool, list[Shape]] = {}
    for guarded in (False, True):
        server = shop(IdempotencyMiddleware(MemoryKeyStore()) if guarded else None, Effects())
        async with caller(server, transport) as call:
            spans.clear()
            await call("nope", {}, meta("span-2"))
            found[guarded] = shapes(spans.get_finished_spans())
    assert found[True] == found[False]
    assert any(s.kind == "SERVER" and s.status == "ERROR" for s in found[True])


# -- D4: versions ------------------------------------------------------------------------------


def versioned(store: MemoryKeyStore, runs: list[str]) -> FastMCP[Any]:
    mcp: FastMCP[Any] = FastMCP("shop")
    mcp.add_middleware(IdempotencyMiddleware(store))

    @mcp.tool(name="charge", version="1.0")
    async def charge_v1(order: str) -> str:
        runs.append("1.0")
        return f"charged {order} (1.0)"

    @mcp.tool(name="charge", version="2.0")
    async def charge_v2(order: str) -> str:
        runs.append("2.0")
        return f"charged {order} (2.0)"

    return mcp


def version(v: str, **more: Any) -> dict[str, Any]:
    return {"fastmcp": {"version": v}, **more}


async def test_two_versions_never_share_a_record() -> None:
    """D4: keyless (derived) and with one client key alike, 1.0 after 2.0 runs 1.0; each
    version's retry replays that version's own answer."""
    runs: list[str] = []
    store = MemoryKeyStore()
    async with serving(versioned(store, runs), "memory") as connect, connect() as c:
        keyless = [
            await c.call_tool_mcp("charge", {"order": "a"}),
            await c.call_tool_mcp("charge", {"order": "a"}, meta=version("1.0")),
        ]
        await caller_gave_up(store)  # those answers were lost: the next call is a re-send
        keyless.append(await c.call_tool_mcp("charge", {"order": "a"}, meta=version("1.0")))
        keyed = [
            await c.call_tool_mcp("charge", {"order": "b"}, meta=version("2.0", **meta("k"))),
            await c.call_tool_mcp("charge", {"order": "b"}, meta=version("1.0", **meta("k"))),
            await c.call_tool_mcp("charge", {"order": "b"}, meta=version("1.0", **meta("k"))),
            await c.call_tool_mcp("charge", {"order": "b"}, meta=version("2.0", **meta("k"))),
        ]
    assert runs == ["2.0", "1.0", "2.0", "1.0"]
    texts = [r.content[0].text for r in keyless + keyed]  # type: ignore[union-attr]
    assert texts == [
        "charged a (2.0)",
        "charged a (1.0)",
        "charged a (1.0)",
        "charged b (2.0)",
        "charged b (1.0)",
        "charged b (1.0)",
        "charged b (2.0)",
    ]
    statuses = [marker(r)["status"] for r in keyless + keyed]
    assert statuses == [
        "executed",
        "executed",
        "replayed",
        "executed",
        "executed",
        "replayed",
        "replayed",
    ]


# -- D5: authorization -------------------------------------------------------------------------


class Permission:
    """What the global check allows, switchable mid-test (a revoked grant)."""

    def __init__(self) -> None:
        self.admin = True

    def check(self, ctx: AuthContext) -> bool:
        return self.admin or "admin" not in ctx.component.tags


def guarded_shop(order: str, permission: Permission, effects: Effects) -> FastMCP[Any]:
    """`wipe` (tagged admin: the global AuthMiddleware may refuse it) and `secret` (hidden by
    component auth from everyone), with the guard before or after AuthMiddleware, or absent."""
    mcp: FastMCP[Any] = FastMCP("shop")
    auth = AuthMiddleware(auth=permission.check)
    guard = IdempotencyMiddleware(MemoryKeyStore())
    chain = {"guard-first": [guard, auth], "auth-first": [auth, guard], "none": [auth]}[order]
    for middleware in chain:
        mcp.add_middleware(middleware)

    @mcp.tool(tags={"admin"})
    async def wipe(order: str) -> str:
        effects.count += 1
        return f"wiped {order}"

    @mcp.tool(auth=lambda ctx: False)
    async def secret(order: str) -> str:
        effects.count += 1
        return "the secret"

    return mcp


@pytest.mark.parametrize("order", ["guard-first", "auth-first"])
@pytest.mark.parametrize("transport", ["memory", "http"])
async def test_an_unauthorized_caller_gets_fastmcps_answer_in_any_order(
    order: str, transport: str
) -> None:
    """D5: a hidden tool answers FastMCP's "not found or not authorized" (keyed or not), and a
    caller whose grant was revoked gets the authorization error, never a replay of the record
    its earlier, authorized call left."""
    seen: dict[str, list[Any]] = {}
    traced: dict[str, list[list[Shape]]] = {}
    spans = recorder()
    for setup in (order, "none"):
        effects, permission = Effects(), Permission()
        server = guarded_shop(setup, permission, effects)
        answers: list[Any] = []
        traced[setup] = []
        steps = [  # (tool, key, grant revoked)
            ("secret", meta("s"), False),
            ("secret", None, False),
            ("wipe", meta("w"), False),
            ("wipe", meta("w"), True),
            ("wipe", None, True),
        ]
        async with caller(server, transport) as call:
            for name, key, revoked in steps:
                permission.admin = not revoked
                spans.clear()
                answers.append(await call(name, {"order": "o"}, key))
                traced[setup].append(shapes(spans.get_finished_spans()))
        seen[setup] = [*answers, effects.count]
    refused = [0, 1, 3, 4]
    for i in refused:  # answers and spans exactly FastMCP's, the guard's span absent
        assert seen[order][i] == seen["none"][i], i
        assert traced[order][i] == traced["none"][i], i
    for answer in seen[order][:2]:
        assert "not found or not authorized" in str(answer)
    assert "insufficient permissions" in str(seen[order][3])
    assert seen[order][-1] == 1  # the authorized wipe ran once; nothing else ran


# -- Merging that respects intent --------------------------------------------------------------


async def test_a_read_only_tool_is_never_merged_without_a_key() -> None:
    effects = Effects()
    store = MemoryKeyStore()
    server = shop(IdempotencyMiddleware(store), effects)
    async with serving(server, "memory") as connect, connect() as client:
        listed = {t.name: t for t in await client.list_tools()}
        keyless = [await client.call_tool_mcp("look", {"order": "o"}) for _ in "12"]
        keyed = [await client.call_tool_mcp("look", {"order": "o"}, meta=meta("r")) for _ in "12"]
    assert [r.content[0].text for r in keyless] == [  # type: ignore[union-attr]
        "looked at o (read 1)",
        "looked at o (read 2)",
    ]
    assert all(wire.IDEMPOTENCY_META not in (r.meta or {}) for r in keyless)
    # A client key still replays: a retry of one logical read gets that read's answer.
    assert [marker(r)["status"] for r in keyed] == ["executed", "replayed"]
    assert effects.count == 3
    # Listed as what it is: read-only by its author, keyless calls not merged.
    hint, entry = promise(listed["look"])
    assert listed["look"].annotations is not None
    assert listed["look"].annotations.read_only_hint is True
    assert (hint, entry["keys"]) == (None, "optional")
    assert promise(listed["charge"]) == (True, {"keys": "derived", "retentionSeconds": 86400})


@pytest.mark.parametrize(
    "options", [{"underived": {"charge"}}, {"derived": False}], ids=["underived", "derived-off"]
)
async def test_a_tool_opted_out_of_derived_merging_runs_each_keyless_call(
    options: dict[str, Any],
) -> None:
    effects = Effects()
    server = shop(IdempotencyMiddleware(MemoryKeyStore(), **options), effects)
    async with serving(server, "memory") as connect, connect() as client:
        (charge,) = [t for t in await client.list_tools() if t.name == "charge"]
        keyless = [await client.call_tool_mcp("charge", ARGS) for _ in "12"]
        keyed = [await client.call_tool_mcp("charge", ARGS, meta=meta("c")) for _ in "12"]
    assert effects.count == 3
    assert all(wire.IDEMPOTENCY_META not in (r.meta or {}) for r in keyless)
    assert [marker(r)["status"] for r in keyed] == ["executed", "replayed"]
    assert promise(charge) == (None, {"keys": "optional", "retentionSeconds": 86400})


async def test_a_keyless_resend_inside_the_window_is_replayed() -> None:
    """The contrast: an ordinary tool's blind re-send on one connection (its caller gave up on
    the first answer) is merged; a repeat after a delivered answer runs (rule 15)."""
    effects = Effects()
    store = MemoryKeyStore()
    server = shop(IdempotencyMiddleware(store), effects)
    async with serving(server, "memory") as connect, connect() as client:
        first = await client.call_tool_mcp("charge", ARGS)
        await caller_gave_up(store)
        resend = await client.call_tool_mcp("charge", ARGS)
        repeat = await client.call_tool_mcp("charge", ARGS)
    assert effects.count == 2
    assert marker(resend)["status"] == "replayed"
    assert resend.content == first.content
    assert marker(repeat)["status"] == "executed"


def test_underived_must_be_a_collection_of_names() -> None:
    with pytest.raises(TypeError, match="underived must be a collection of strings"):
        IdempotencyMiddleware(MemoryKeyStore(), underived="create_session")
    with pytest.raises(TypeError, match="derived must be True or False"):
        IdempotencyMiddleware(MemoryKeyStore(), derived="no")  # type: ignore[typeddict-item]


async def test_fastmcps_own_create_session_gives_a_new_session_each_keyless_call() -> None:
    """FastMCP's built-in tools are never merged without a key: two `create_session` calls
    are two sessions; a client key still makes one."""
    server: FastMCP[Any] = FastMCP("shop")
    server.add_middleware(IdempotencyMiddleware(MemoryKeyStore()))
    server.add_provider(SessionProvider())

    def text(result: CallToolResult) -> str:
        return str(result.content[0].text)  # type: ignore[union-attr]

    async with serving(server, "memory") as connect, connect() as client:
        keyless = [text(await client.call_tool_mcp("create_session", {})) for _ in "12"]
        keyed = [
            text(await client.call_tool_mcp("create_session", {}, meta=meta("s"))) for _ in "12"
        ]
    assert keyless[0] != keyless[1]
    assert keyed[0] == keyed[1]


# -- Found by FastMCP's own test suite run with the middleware on every server ------------------


class Payload(BaseModel):
    token: int


class SelfValidating(Tool):
    """A tool class that validates its own arguments (FastMCP answers its pydantic error as
    invalid params, -32602)."""

    runs: ClassVar[list[int]] = []

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        Payload.model_validate(arguments)
        self.runs.append(1)
        return ToolResult(content="ok")


@pytest.mark.parametrize("transport", ["memory", "http"])
async def test_a_tool_refusing_its_own_arguments_is_answered_as_fastmcp_does(
    transport: str,
) -> None:
    seen: dict[bool, list[Any]] = {}
    store = MemoryKeyStore()
    for guarded in (False, True):
        server: FastMCP[Any] = FastMCP("shop")
        if guarded:
            server.add_middleware(IdempotencyMiddleware(store))
        server.add_tool(SelfValidating(name="submit", parameters={"type": "object"}))
        async with caller(server, transport) as call:
            seen[guarded] = [await call("submit", {"token": "x"}, k) for k in (meta("v"), None)]
    assert seen[True] == seen[False]
    assert seen[True][0][:2] == ("error", -32602)
    assert await store.list_records() == []  # refused: released, nothing kept


def test_the_middleware_loads_no_optional_fastmcp_module() -> None:
    """A guarded server's default HTTP app loads nothing FastMCP keeps opt-in (FastMCP's own
    start-up import test, with the middleware added): the order check against the response
    cache does not import the cache (and with it `py-key-value`)."""
    script = textwrap.dedent(
        """
        import sys
        from fastmcp import FastMCP
        from idempotency import MemoryKeyStore
        from idempotency.fastmcp import IdempotencyMiddleware

        server = FastMCP("import guard")
        server.add_middleware(IdempotencyMiddleware(MemoryKeyStore()))

        @server.tool
        def echo(value: str) -> str:
            return value

        assert server.http_app(transport="http", stateless_http=True) is not None
        roots = ("fastmcp.server.event_store", "griffe", "jsonref", "key_value", "prefab_ui",
                 "fastmcp.server.middleware.caching")
        loaded = [n for n in sys.modules if any(n == r or n.startswith(r + ".") for r in roots)]
        assert not loaded, loaded
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


async def test_keyless_calls_differing_in_their_meta_input_are_two_calls() -> None:
    """A tool may read the request `_meta` (FastMCP's `test_call_tool_with_meta`): two keyless
    calls with the same arguments and another `user_id` there are two calls. A re-send that
    differs only in what changes per send (trace context, progress token) is still merged."""
    server: FastMCP[Any] = FastMCP("shop")
    store = MemoryKeyStore()
    server.add_middleware(IdempotencyMiddleware(store))
    runs: list[str] = []

    @server.tool
    async def whoami(ctx: Context) -> str:
        request = ctx.request_context
        user = str(((request.meta if request is not None else None) or {}).get("user_id"))
        runs.append(user)
        return user

    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with serving(server, "memory") as connect, connect() as client:
        sent = [
            await client.call_tool_mcp("whoami", {}, meta={"user_id": "ann"}),
            await client.call_tool_mcp("whoami", {}, meta={"user_id": "bob"}),
            await client.call_tool_mcp("whoami", {}),
        ]
        await caller_gave_up(store)  # every answer lost: what follows is a re-send
        sent.append(
            await client.call_tool_mcp(
                "whoami", {}, meta={"user_id": "ann", "traceparent": trace, "progressToken": 7}
            )
        )
    assert runs == ["ann", "bob", "None"]
    assert [marker(r)["status"] for r in sent] == ["executed", "executed", "executed", "replayed"]
    assert sent[3].content == sent[0].content
