"""A LangGraph agent worker for the crash tests: run in the LangGraph environment (its own `uv`
project, `integrations/langgraph`, with `mcp` < 2), never imported by the main test suite.

One thread of a two-node graph: a scripted model that asks for one `pay` (with the test's
`call_id`, so the shop's ledger counts the effects of this logical call), then reports; a
`ToolNode` with `langchain-mcp-adapters`' tools of the shop (`MultiServerMCPClient`, one HTTP
session per call), and `CheckpointKeys` last among the interceptors when `--keys` is given; a SQLite
checkpointer. Started again after a crash, the same command resumes the thread from its newest
checkpoint, as a recovering deployment would.

`--tool-call-id random` makes the model mint a new tool-call id on every run, as a real model
does: only a checkpoint written before the tool ran (`durability="sync"`) keeps the first one.

Each MCP result the worker sees (text, the server's replay marker) and the thread's final tool
message are appended to `--out` as JSON lines, for the test to read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

from crash_point import crash_point
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.interceptors import MCPToolCallRequest
from langchain_mcp_adapters.sessions import Connection
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from mcp.types import CallToolResult, TextContent
from mcp_once_langgraph import IDEMPOTENCY_META, CheckpointKeys

FIXED_TOOL_CALL_ID = "call-pay-1"


def text_of(content: Any) -> str:
    """The text of an MCP result or a tool message's content (a str or content blocks)."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block["text"]))
    return "".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument(
        "--job",
        nargs=3,
        action="append",
        required=True,
        metavar=("DB", "THREAD", "CALL_ID"),
        help="a thread to run or resume, with its SQLite checkpointer file and the `pay`"
        " call_id; several run one after the other (a recovering deployment resumes them all)",
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--keys", action="store_true", help="CheckpointKeys last interceptor")
    parser.add_argument("--durability", default="sync", choices=["sync", "async", "exit", "unset"])
    parser.add_argument("--tool-call-id", default="fixed", choices=["fixed", "random"])
    args = parser.parse_args()
    asyncio.run(run(args))


async def run(args: argparse.Namespace) -> None:
    out = Path(args.out)

    def note(**fields: Any) -> None:
        with out.open("a") as file:
            file.write(json.dumps({"pid": os.getpid(), **fields}) + "\n")

    async def observe(request: MCPToolCallRequest, handler: Any) -> Any:
        """Outermost interceptor: the crash windows around the call, and what came back."""
        crash_point("before")
        result = await handler(request)
        assert isinstance(result, CallToolResult)
        marker = (result.meta or {}).get(IDEMPOTENCY_META)
        call_id = request.args.get("call_id")
        note(event="result", call_id=call_id, text=text_of(result.content), marker=marker)
        crash_point("after")
        return result

    connections: dict[str, Connection] = {
        "shop": {"transport": "streamable_http", "url": args.url},
    }
    interceptors: list[Any] = [observe]
    if args.keys:
        interceptors.append(CheckpointKeys(connections=connections))
    client = MultiServerMCPClient(connections, tool_interceptors=interceptors)
    tools = [tool for tool in await client.get_tools() if tool.name == "pay"]

    def model(state: MessagesState, config: RunnableConfig) -> dict[str, list[AnyMessage]]:
        """A scripted model: one `pay`, then a report of what the tool said."""
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):
            return {"messages": [AIMessage(f"paid: {text_of(last.content)}")]}
        call_id = FIXED_TOOL_CALL_ID if args.tool_call_id == "fixed" else f"call-{uuid.uuid4()}"
        pay = {"call_id": config["configurable"]["call_id"], "account": "acme", "cents": 500}
        return {
            "messages": [AIMessage("", tool_calls=[{"name": "pay", "args": pay, "id": call_id}])]
        }

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    builder.add_edge("tools", "model")

    for db, thread, call_id in args.job:
        async with AsyncSqliteSaver.from_conn_string(db) as saver:
            graph = builder.compile(checkpointer=saver)
            config: Any = {"configurable": {"thread_id": thread, "call_id": call_id}}
            state = await graph.aget_state(config)
            # A thread with a pending step is resumed from its checkpoint; a new one is started.
            inputs = None if state.next else {"messages": [HumanMessage("pay acme 5.00")]}
            if state.values and not state.next:
                final = state.values
            elif args.durability == "unset":
                final = await graph.ainvoke(inputs, config)
            else:
                final = await graph.ainvoke(inputs, config, durability=args.durability)
        tool_messages = [m for m in final["messages"] if isinstance(m, ToolMessage)]
        note(
            event="final",
            call_id=call_id,
            tool_messages=[text_of(m.content) for m in tool_messages],
            tool_call_ids=[m.tool_call_id for m in tool_messages],
            answer=text_of(final["messages"][-1].content),
        )


if __name__ == "__main__":
    main()
