"""Unit tests of `mcp_once_langgraph`, in the LangGraph environment: real graphs, real `ToolNode`s,
real checkpointers (in memory), the adapters' real tools; the MCP session is a recorder (the crash
tests in mcp-once's suite use the real server). Run: `uv run --directory integrations/langgraph
pytest` (mcp-once's suite runs it too).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_mcp_adapters.tools import convert_mcp_tool_to_langchain_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from mcp.types import CallToolResult, TextContent, Tool
from mcp_once_langgraph import (
    IDEMPOTENCY_META,
    KEY_META,
    CheckpointKeys,
    DurabilityError,
    call_identity,
    checkpoint_key,
)

#: The same vector is checked against mcp-once's own `derive_key` in its suite
#: (tests/durable/test_langgraph_integration.py): the two derivations must stay one.
VECTOR = {
    "thread_id": "thread-1",
    "checkpoint_ns": "tools:7d6c2d1e-0d54-5c0e-9f63-2b4f1f0f3c11",
    "checkpoint_id": "1f0a2b3c-4d5e-6f70-8001-123456789abc",
    "tool_call_id": "call-1",
    "tool": "pay",
}
VECTOR_KEY = "langgraph-c4a6c64ad9170d51e536670ec98425fa175d4809"

PAY = Tool(
    name="pay",
    inputSchema={"type": "object", "properties": {"cents": {"type": "integer"}}},
)


class RecordingSession:
    """Stands in for `mcp.ClientSession`: records each call's `meta`, answers like a guarded
    server (executed the first time a key is seen, replayed after)."""

    def __init__(self, *, lose_first_answer: bool = False) -> None:
        self.calls: list[tuple[str, dict[str, Any] | None]] = []
        self.lose_first_answer = lose_first_answer

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, *_: Any, **kw: Any
    ) -> CallToolResult:
        meta = kw.get("meta")
        key = (meta or {}).get(KEY_META)
        seen = key is not None and any(m and m.get(KEY_META) == key for _, m in self.calls)
        self.calls.append((name, meta))
        if self.lose_first_answer and len(self.calls) == 1:
            raise ConnectionError("the answer was lost (the tool ran)")
        marker = {"key": key, "status": "replayed" if seen else "executed"}
        return CallToolResult(
            content=[TextContent(type="text", text=f"paid {len(self.calls)}")],
            _meta={IDEMPOTENCY_META: marker},
        )

    @property
    def keys(self) -> list[str | None]:
        return [(meta or {}).get(KEY_META) for _, meta in self.calls]


def graph(session: RecordingSession, *, calls: int = 1, **options: Any) -> Any:
    """A scripted model asking for `calls` pays in one message, a tool node, a checkpointer."""
    tool = convert_mcp_tool_to_langchain_tool(
        session,  # type: ignore[arg-type]
        PAY,
        tool_interceptors=[CheckpointKeys(session=session, **options)],  # type: ignore[arg-type]
    )

    def model(state: MessagesState) -> dict[str, list[AnyMessage]]:
        if isinstance(state["messages"][-1], ToolMessage):
            return {"messages": [AIMessage("done")]}
        asks = [{"name": "pay", "args": {"cents": 5}, "id": f"call-{n}"} for n in range(calls)]
        return {"messages": [AIMessage("", tool_calls=asks)]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode([tool]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    builder.add_edge("tools", "model")
    return builder


INPUT = {"messages": [HumanMessage("pay")]}


async def before_tools_step(app: Any, config: Any) -> Any:
    """The thread's checkpoint from which the tool step ran."""
    async for snapshot in app.aget_state_history(config):
        if snapshot.next == ("tools",):
            return snapshot
    raise AssertionError("the thread has no checkpoint before a tool step")


def test_the_key_is_mcp_once_s_derivation_of_the_checkpoint_identity() -> None:
    assert checkpoint_key(**VECTOR) == VECTOR_KEY
    assert KEY_META == "io.github.mcp-once/idempotency-key"


async def test_sync_durability_sends_the_key_of_the_tool_step_s_checkpoint() -> None:
    session = RecordingSession()
    app = graph(session).compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t-1"}}
    await app.ainvoke(INPUT, config, durability="sync")
    # The checkpoint the tool step ran from, and its task: what a resume hands the step again.
    before_tools = await before_tools_step(app, config)
    (task,) = before_tools.tasks
    expected = checkpoint_key(
        thread_id="t-1",
        checkpoint_ns=f"tools:{task.id}",
        checkpoint_id=before_tools.config["configurable"]["checkpoint_id"],
        tool_call_id="call-0",
        tool="pay",
    )
    assert session.keys == [expected]


async def test_resuming_the_thread_after_a_failed_tool_step_sends_the_same_key() -> None:
    """What a restart after a crash does: the pending step from the same checkpoint, again."""
    session = RecordingSession(lose_first_answer=True)
    app = graph(session).compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t-2"}}
    with pytest.raises(ConnectionError):
        await app.ainvoke(INPUT, config, durability="sync")
    assert (await app.aget_state(config)).next == ("tools",)
    final = await app.ainvoke(None, config, durability="sync")
    assert len(session.keys) == 2 and session.keys[0] == session.keys[1]
    replies = [m.content for m in final["messages"] if isinstance(m, ToolMessage)]
    assert len(replies) == 1


async def test_a_tool_node_in_a_subgraph_is_keyed_from_the_subgraph_s_checkpoint() -> None:
    """Inside a subgraph the namespace has the parent's part (`agent|tools:<task>`) and the
    checkpoint is the subgraph's own; a resume of the parent gives the same key."""
    session = RecordingSession(lose_first_answer=True)
    keys = CheckpointKeys(session=session)  # type: ignore[arg-type]
    seen = []

    async def spy(request: Any, handler: Any) -> Any:
        seen.append(call_identity(request.runtime, request.name))
        return await handler(request)

    tool = convert_mcp_tool_to_langchain_tool(
        session,  # type: ignore[arg-type]
        PAY,
        tool_interceptors=[spy, keys],
    )
    inner = _single_tool_graph(tool).compile(checkpointer=True)
    outer = StateGraph(MessagesState)
    outer.add_node("agent", inner)
    outer.add_edge(START, "agent")
    outer.add_edge("agent", END)
    app = outer.compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t-sub"}}
    with pytest.raises(ConnectionError):
        await app.ainvoke(INPUT, config, durability="sync")
    await app.ainvoke(None, config, durability="sync")
    assert len(session.keys) == 2 and session.keys[0] == session.keys[1]
    identity = seen[0]
    assert identity is not None and identity.checkpoint_ns.startswith("agent|tools:")
    assert identity.checkpoint_id and identity.durability == "sync"
    assert session.keys[0] == identity.key


async def test_a_fork_from_an_earlier_checkpoint_is_a_new_call() -> None:
    """Time travel (invoking with an earlier checkpoint's id) makes a new branch with a new
    checkpoint: LangGraph runs the step again there by design, and so does the server."""
    session = RecordingSession()
    app = graph(session).compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t-fork"}}
    await app.ainvoke(INPUT, config, durability="sync")
    await app.ainvoke(None, (await before_tools_step(app, config)).config, durability="sync")
    assert len(session.keys) == 2 and session.keys[0] != session.keys[1]


async def test_other_threads_and_tool_calls_get_other_keys() -> None:
    session = RecordingSession()
    app = graph(session, calls=2).compile(checkpointer=InMemorySaver())
    for thread in ("t-a", "t-b"):
        await app.ainvoke(INPUT, {"configurable": {"thread_id": thread}}, durability="sync")
    assert len(session.keys) == 4 and len(set(session.keys)) == 4


@pytest.mark.parametrize("durability", [None, "async", "exit"])
async def test_a_durability_other_than_sync_is_refused_before_sending(
    durability: str | None,
) -> None:
    session = RecordingSession()
    app = graph(session).compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t-3"}}
    options = {} if durability is None else {"durability": durability}
    with pytest.raises(DurabilityError, match=f"durability='{durability or 'async'}'"):
        await app.ainvoke(INPUT, config, **options)
    assert session.calls == []


async def test_a_graph_without_checkpointer_is_refused() -> None:
    session = RecordingSession()
    app = graph(session).compile()
    with pytest.raises(DurabilityError, match="no checkpointer"):
        await app.ainvoke(INPUT)
    assert session.calls == []


async def test_a_tool_run_outside_a_tool_node_is_refused() -> None:
    session = RecordingSession()
    tool = convert_mcp_tool_to_langchain_tool(
        session,  # type: ignore[arg-type]
        PAY,
        tool_interceptors=[CheckpointKeys(session=session)],  # type: ignore[arg-type]
    )
    with pytest.raises(DurabilityError, match="no LangGraph tool runtime"):
        await tool.ainvoke({"cents": 5})
    assert session.calls == []


async def test_warn_sends_with_a_loud_warning_instead(caplog: pytest.LogCaptureFixture) -> None:
    session = RecordingSession()
    app = graph(session, on_unsafe="warn").compile(checkpointer=InMemorySaver())
    with caplog.at_level(logging.WARNING, logger="mcp_once_langgraph"):
        await app.ainvoke(INPUT, {"configurable": {"thread_id": "t-4"}}, durability="async")
    assert len(session.keys) == 1 and str(session.keys[0]).startswith("langgraph-")
    assert "may not survive a crash" in caplog.text and "durability='async'" in caplog.text
    # Outside a tool node there is nothing to key from: sent as the adapters send it, unkeyed.
    tool = convert_mcp_tool_to_langchain_tool(
        session,  # type: ignore[arg-type]
        PAY,
        tool_interceptors=[CheckpointKeys(session=session, on_unsafe="warn")],  # type: ignore[arg-type]
    )
    await tool.ainvoke({"cents": 5})
    assert session.keys[-1] is None


async def test_a_replay_is_logged_without_arguments_or_results(
    caplog: pytest.LogCaptureFixture,
) -> None:
    session = RecordingSession(lose_first_answer=True)
    app = graph(session).compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t-5"}}
    with pytest.raises(ConnectionError):
        await app.ainvoke(INPUT, config, durability="sync")
    with caplog.at_level(logging.INFO, logger="mcp_once_langgraph"):
        await app.ainvoke(None, config, durability="sync")
    assert "tool pay: the server replayed the stored result" in caplog.text
    assert "paid" not in caplog.text and "cents" not in caplog.text


def test_it_needs_one_session_or_one_mapping_of_connections() -> None:
    session: Any = RecordingSession()
    with pytest.raises(ValueError, match="exactly one"):
        CheckpointKeys()
    with pytest.raises(ValueError, match="exactly one"):
        CheckpointKeys(session=session, connections={})
    with pytest.raises(ValueError, match="on_unsafe"):
        CheckpointKeys(session=session, on_unsafe="ignore")  # type: ignore[arg-type]


async def test_an_unknown_server_is_named() -> None:
    keys = CheckpointKeys(connections={"shop": {"transport": "streamable_http", "url": "x"}})
    tool = convert_mcp_tool_to_langchain_tool(
        None,
        PAY,
        connection={"transport": "streamable_http", "url": "http://127.0.0.1:9/mcp"},
        server_name="other",
        tool_interceptors=[keys],
    )
    app = _single_tool_graph(tool).compile(checkpointer=InMemorySaver())
    with pytest.raises(KeyError, match="no connection for server 'other'"):
        await app.ainvoke(INPUT, {"configurable": {"thread_id": "t-6"}}, durability="sync")


def _single_tool_graph(tool: Any) -> Any:
    def model(state: MessagesState) -> dict[str, list[AnyMessage]]:
        ask = {"name": "pay", "args": {"cents": 5}, "id": "call-0"}
        return {"messages": [AIMessage("", tool_calls=[ask])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode([tool]))
    builder.add_edge(START, "model")
    builder.add_edge("model", "tools")
    builder.add_edge("tools", END)
    return builder
