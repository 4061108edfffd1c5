"""`RetryingSession` carrying an input-required round (SEP-2322) of a keyed call, on a 2026-07-28
session: the server's question comes back as an answer (never retried), the continuation goes out
under the same key with the caller's answers and is retried exactly as any call is, and the guard
on the server stores only the final result.

The server is a real `MCPServer` whose tool is guarded (`@idempotent`): it asks for a name until an
answer comes, and appends to a ledger when it completes, so what is counted is what ran. The
lossy link is `orchestrator.chaos` (request numbers count `tools/call`s of `greet` only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastmcp import Client as FastMCPClient
from fastmcp import Context as FastMCPContext
from fastmcp import FastMCP
from mcp.client import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
    InputResponses,
    TextContent,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from idempotency import MemoryKeyStore, idempotent, wire
from idempotency.fastmcp import IdempotencyMiddleware
from orchestrator import (
    MemoryJournal,
    OutcomeUnknown,
    RetryingSession,
    RetryPolicy,
    Run,
    tool_session,
)
from orchestrator.chaos import Chaos, Fault, FaultPlan

pytestmark = pytest.mark.anyio

POLICY = RetryPolicy(max_attempts=3, attempt_timeout=1.0, deadline=30.0)
ANSWER: InputResponses = {"user_name": ElicitResult(action="accept", content={"name": "Ann"})}


ASK = ElicitRequest(
    params=ElicitRequestFormParams(
        message="What is your name?",
        requested_schema={"type": "object", "properties": {"name": {"type": "string"}}},
    )
)


@dataclass
class Desk:
    """What the server's tool did: questions asked, greetings completed."""

    asked: int = 0
    ledger: list[str] = field(default_factory=list)
    store: MemoryKeyStore = field(default_factory=MemoryKeyStore)

    def greet(self, responses: InputResponses | None) -> CallToolResult | InputRequiredResult:
        """The tool's body, on either server: ask for the name, or greet with the answer."""
        answer = (responses or {}).get("user_name")
        if not isinstance(answer, ElicitResult) or answer.action != "accept":
            self.asked += 1
            return InputRequiredResult(input_requests={"user_name": ASK})
        name = str((answer.content or {}).get("name"))
        self.ledger.append(name)
        return CallToolResult(content=[TextContent(type="text", text=f"Hello, {name}!")])


def desk_server(desk: Desk) -> MCPServer:
    server = MCPServer("desk")

    @server.tool()
    @idempotent(desk.store)
    async def greet(ctx: Context) -> CallToolResult | InputRequiredResult:
        return desk.greet(ctx.input_responses)

    return server


def status(result: CallToolResult) -> object:
    entry = (result.meta or {}).get(wire.IDEMPOTENCY_META)
    return entry.get("status") if isinstance(entry, dict) else None


def text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


async def test_the_question_returns_and_the_continuation_runs_once_under_the_same_key() -> None:
    desk = Desk()
    async with Client(desk_server(desk)) as client:
        assert client.session.protocol_version in MODERN_PROTOCOL_VERSIONS
        rs = RetryingSession(client, policy=POLICY)
        question, asked = await rs.call_tool_with_report(
            "greet", idempotency_key="k-1", allow_input_required=True
        )
        assert isinstance(question, InputRequiredResult)
        assert (asked.outcome, len(asked.attempts), asked.key) == ("input_required", 1, "k-1")
        assert await desk.store.list_records() == []  # a question is never stored (rule 8)
        final, done = await rs.call_tool_with_report(
            "greet",
            idempotency_key="k-1",
            input_responses=ANSWER,
            request_state=question.request_state,
            allow_input_required=True,
        )
        again = await rs.call_tool("greet", idempotency_key="k-1")  # a plain re-send
    assert isinstance(final, CallToolResult) and done.outcome == "result"
    assert (text(final), status(final), status(again)) == ("Hello, Ann!", "executed", "replayed")
    assert again.content == final.content and done.key == "k-1"
    assert (desk.asked, desk.ledger) == (1, ["Ann"])
    assert len(await desk.store.list_records()) == 1


def fastmcp_desk(desk: Desk) -> FastMCP:
    """The same desk as a FastMCP server guarded by `IdempotencyMiddleware`."""
    server = FastMCP("desk")
    server.add_middleware(IdempotencyMiddleware(desk.store))

    @server.tool
    async def greet(ctx: FastMCPContext) -> CallToolResult | InputRequiredResult:
        return desk.greet(ctx.input_responses)

    return server


async def test_a_fastmcp_client_carries_the_round_too() -> None:
    """`fastmcp.Client` (`FastMCPSession`): the round goes out on its session, under its watch."""
    desk = Desk()
    async with FastMCPClient(fastmcp_desk(desk)) as client:
        assert client.protocol_version in MODERN_PROTOCOL_VERSIONS
        rs = RetryingSession(client, policy=POLICY)
        question = await rs.call_tool("greet", idempotency_key="k-f", allow_input_required=True)
        assert isinstance(question, InputRequiredResult)
        final = await rs.call_tool(
            "greet", idempotency_key="k-f", input_responses=ANSWER, allow_input_required=True
        )
        again = await rs.call_tool("greet", idempotency_key="k-f")
    assert isinstance(final, CallToolResult)
    assert (text(final), status(final), status(again)) == ("Hello, Ann!", "executed", "replayed")
    assert (desk.asked, desk.ledger) == (1, ["Ann"])


def lossy(desk: Desk, fault: Fault) -> tuple[Chaos, Callable[[], Client]]:
    """A link on which the second `greet` (the continuation) meets `fault`."""
    chaos = Chaos(FaultPlan(schedule={2: fault}, tools={"greet"}), seed=3)
    server = desk_server(desk)
    return chaos, lambda: Client(chaos.wrap(server))


@pytest.mark.parametrize(
    ("fault", "trust", "ended", "then"),
    [
        (Fault.CLOSE_BEFORE_WRITE, True, "executed", "replayed"),
        (Fault.CLOSE_BEFORE_WRITE, False, "not_idempotent", "executed"),
        (Fault.LOST_ACK, True, "replayed", "replayed"),
        (Fault.LOST_ACK, False, "not_idempotent", "replayed"),
    ],
)
async def test_a_continuation_that_may_have_run_is_re_sent_only_where_the_gate_allows(
    fault: Fault, trust: bool, ended: str, then: str
) -> None:
    """The continuation's failures are classified as any call's (both faults: it may have run).
    Trusted, the guarded tool's listing (idempotent: it is keyed) opens the gate and the
    continuation is re-sent under its key, on a new session when the link died; untrusted (as the
    proxy runs), it is `OutcomeUnknown`. The same key afterwards gets what the server stored, or
    runs it when it never arrived: the tool completes once."""
    desk = Desk()
    chaos = Chaos(FaultPlan(schedule={2: fault}, tools={"greet"}), seed=3)
    server = desk_server(desk)
    policy = RetryPolicy(
        max_attempts=3, attempt_timeout=1.0, deadline=30.0, trust_annotations=trust
    )
    async with RetryingSession(connect=lambda: Client(chaos.wrap(server)), policy=policy) as rs:
        await rs.call_tool("greet", idempotency_key="k-2", allow_input_required=True)
        try:
            final = await rs.call_tool(
                "greet", idempotency_key="k-2", input_responses=ANSWER, allow_input_required=True
            )
            assert isinstance(final, CallToolResult)
            outcome = status(final)
        except OutcomeUnknown as lost:
            assert lost.key == "k-2" and lost.report is not None
            assert lost.report.attempts[0].failure == "maybe_executed"
            outcome = lost.reason
        await chaos.settled()
        again = await rs.call_tool("greet", idempotency_key="k-2", input_responses=ANSWER)
    assert [f.kind for f in chaos.faults] == [fault]
    assert (outcome, status(again), text(again)) == (ended, then, "Hello, Ann!")
    assert (desk.asked, desk.ledger) == (1, ["Ann"])


async def test_a_question_the_call_did_not_allow_is_refused_as_the_sdk_refuses_it() -> None:
    desk = Desk()
    declined: InputResponses = {"user_name": ElicitResult(action="decline")}
    async with Client(desk_server(desk)) as client:
        rs = RetryingSession(client, policy=POLICY)
        with pytest.raises(RuntimeError, match="asked for client input"):
            await rs.call_tool("greet", idempotency_key="k-4", input_responses=declined)
        assert rs.last_report is not None and rs.last_report.outcome == "input_required"
    assert (desk.asked, desk.ledger) == (1, [])


class NoRounds:
    """A user's `ToolSession` written before rounds existed: it has no `call_tool_round`."""

    def __init__(self, inner: Client) -> None:
        self.adapted = tool_session(inner)
        self.sent = 0

    async def call_tool(self, *args: Any, **kwargs: Any) -> CallToolResult:
        self.sent += 1
        return await self.adapted.call_tool(*args, **kwargs)

    async def list_tools_page(self, cursor: str | None) -> Any:
        return await self.adapted.list_tools_page(cursor)

    def closed(self) -> bool:
        return self.adapted.closed()

    def watch_list_changed(self, on_change: Callable[[], None]) -> bool:
        return False


async def test_a_session_that_cannot_carry_a_round_is_refused_before_sending() -> None:
    desk = Desk()
    async with Client(desk_server(desk)) as client:
        own = NoRounds(client)
        rs = RetryingSession(own, policy=POLICY)
        with pytest.raises(TypeError, match="NoRounds cannot carry an input-required round"):
            await rs.call_tool("greet", idempotency_key="k-5", allow_input_required=True)
        with pytest.raises(TypeError, match="InputRoundSession"):
            await rs.call_tool("greet", idempotency_key="k-5", input_responses=ANSWER)
    assert own.sent == 0 and desk.asked == 0


async def test_a_continuation_on_a_handshake_era_session_is_refused_before_sending() -> None:
    """The 2025 era has no rounds (a server asks by a request to the client): the answers of
    one cannot be carried there, and nothing is sent."""
    desk = Desk()
    async with Client(desk_server(desk), mode="legacy") as client:
        assert client.session.protocol_version not in MODERN_PROTOCOL_VERSIONS
        rs = RetryingSession(client, policy=POLICY)
        with pytest.raises(TypeError, match="need a 2026-07-28 session"):
            await rs.call_tool("greet", idempotency_key="k-7", input_responses=ANSWER)
    assert desk.asked == 0 and desk.ledger == []


async def test_a_round_cannot_be_journalled_by_a_run() -> None:
    desk = Desk()
    async with (
        Client(desk_server(desk)) as client,
        Run("run-1", journal=MemoryJournal()) as run,
    ):
        rs = RetryingSession(client, policy=POLICY, run=run)
        with pytest.raises(ValueError, match="cannot be journalled by a run"):
            await rs.call_tool("greet", allow_input_required=True)
    assert desk.asked == 0
