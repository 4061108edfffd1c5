"""A LangGraph agent whose MCP payment survives a crash:
`uv run --project integrations/langgraph python examples/langgraph_agent.py [URL]`.

Start the server first, in mcp-once's own environment (`uv run mcp-once serve-example`); the URL
defaults to http://127.0.0.1:8000/mcp. This script runs in the LangGraph environment
(`integrations/langgraph`: `langchain-mcp-adapters` 0.3 needs `mcp` < 2, mcp-once needs `mcp` 2),
where `mcp-once-langgraph` is installed.

`CheckpointKeys`, the last of the adapters' tool interceptors, sends every MCP call with a key made
from the LangGraph checkpoint it runs under (thread, checkpoint namespace, checkpoint id, the
model's tool-call id, tool). A thread resumed from its checkpoint after a crash makes the
interrupted call again with the same key, and the server replays the stored result instead of
charging twice. The graph must run with `durability="sync"` (otherwise the call is refused: with
LangGraph's default, "async", a crash can lose the model's message, and a new tool-call id means
a new key). No LLM is needed to run this: a scripted model node plays one.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

import anyio
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.interceptors import MCPToolCallRequest
from langchain_mcp_adapters.sessions import Connection
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from mcp.types import CallToolResult
from mcp_once_langgraph import IDEMPOTENCY_META, CheckpointKeys


async def main(url: str) -> None:
    connections: dict[str, Connection] = {"shop": {"transport": "streamable_http", "url": url}}
    order = f"order-{uuid.uuid4().hex[:8]}"
    lost: list[str] = []

    async def lose_first_answer(request: MCPToolCallRequest, handler: Any) -> Any:
        """For the demonstration only: the first answer is lost after the server charged, as
        if the worker died before LangGraph recorded it. Also shows the server's replay marker."""
        result = await handler(request)
        if not lost:
            lost.append(request.name)
            raise ConnectionError("the worker died before LangGraph recorded the answer")
        assert isinstance(result, CallToolResult)
        print(f"resumed: {(result.meta or {})[IDEMPOTENCY_META]['status']}")
        return result

    # CheckpointKeys last: it makes the call itself, with the key in the request's `_meta`.
    keys = CheckpointKeys(connections=connections)
    client = MultiServerMCPClient(connections, tool_interceptors=[lose_first_answer, keys])
    tools = [tool for tool in await client.get_tools() if tool.name == "charge"]

    def model(state: MessagesState) -> dict[str, list[AnyMessage]]:
        """Stands in for an LLM: asks for one charge, then reports what the tool said."""
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):
            blocks = [last.content] if isinstance(last.content, str) else last.content
            receipt = "".join(b if isinstance(b, str) else b.get("text", "") for b in blocks)
            return {"messages": [AIMessage(f"charged: {json.dumps(json.loads(receipt))}")]}
        charge = {"name": "charge", "args": {"order_id": order, "cents": 1200}, "id": "call-1"}
        return {"messages": [AIMessage("", tool_calls=[charge])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    builder.add_edge("tools", "model")

    with tempfile.TemporaryDirectory() as tmp:
        async with AsyncSqliteSaver.from_conn_string(str(Path(tmp) / "checkpoints.db")) as saver:
            graph = builder.compile(checkpointer=saver)
            config: Any = {"configurable": {"thread_id": f"thread-{order}"}}
            try:
                await graph.ainvoke(
                    {"messages": [HumanMessage(f"Charge {order} 12.00")]},
                    config,
                    durability="sync",  # the checkpoint is written before the next step runs
                )
            except ConnectionError as lost_answer:
                print(f"first run failed: {lost_answer}")
            # A restarted worker resumes the thread from its checkpoint: the tool step again.
            final = await graph.ainvoke(None, config, durability="sync")
            print(final["messages"][-1].content)

    async with client.session("shop") as session:
        charges = await session.call_tool("list_charges", {"order_id": order})
    print(f"charges for {order}: {len((charges.structuredContent or {})['result'])}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "url",
        nargs="?",
        default="http://127.0.0.1:8000/mcp",
        help="the example server (`uv run mcp-once serve-example`); default: %(default)s",
    )
    anyio.run(main, parser.parse_args().url)
