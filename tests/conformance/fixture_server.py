"""The conformance fixture: one MCP server for every server scenario of the official suite.

`@modelcontextprotocol/conformance` tests a *server* by calling tools, resources and prompts with
fixed names and checking the answers. This module provides them (the names, payloads and
behaviours its server scenarios expect, after the suite's reference server), on `MCPServer`:

- tools: text, image, audio, embedded resource, mixed content, an error, logging and progress
  notifications during the call, sampling and elicitation (plain, SEP-1034 defaults, SEP-1330
  enums) back to the client, a JSON Schema 2020-12 input schema, an SSE stream closed mid-call;
- for the 2026-07-28 suite: multi-round-trip tools (SEP-2322: `InputRequiredResult` rounds with
  elicitation, sampling and roots requests, `requestState`), a tool that requires the sampling
  capability (-32021), one with an `Mcp-Param-*` header parameter, list-changed triggers;
- resources (static text, static binary, a template, a subscribable one), subscribe/unsubscribe;
- prompts (simple, with arguments, with an embedded resource, with an image, multi-round);
- `logging/setLevel` and `completion/complete`.

Guarded mode (the default) calls `idempotency.install(server, store)` with the DEFAULT options, so
every tool is guarded exactly as a server author who writes that one line gets it; `--unguarded`
serves the same server bare. One tool no scenario calls, `mcp_once_keyed_record`, carries its own
`@idempotent(store, key_argument="idempotency_key")` in guarded mode (issue 24: a key from a tool
argument), so the suites also list, and run their generic checks over, a tool whose input schema
gained the key argument; `install()` leaves it its own policy. The store is `SQLiteKeyStore` (the
embedded default) in a temporary directory, so results take the on-disk encode/decode path.
`tests/conformance/run_conformance.py` runs the suites against both modes and requires the
guarded server to pass everything the unguarded one passes.

    uv run python tests/conformance/fixture_server.py --port 0 [--unguarded] [--store URL]

prints `conformance fixture at http://127.0.0.1:PORT/mcp ...` on stdout once it listens.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import signal
import socket
import sys
import tempfile
import threading
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import anyio
import uvicorn
from fixture_tasks import TASK_TOOLS, TasksFixture
from mcp import MCPError
from mcp.server.context import ServerRequestContext
from mcp.server.extension import Extension
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.prompts.base import Message, UserMessage
from mcp.server.mcpserver.tools import Tool
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types import (
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    AudioContent,
    CallToolResult,
    Completion,
    CompletionArgument,
    CompletionContext,
    ContentBlock,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    EmbeddedResource,
    EmptyResult,
    ImageContent,
    InputRequest,
    InputRequiredResult,
    ListRootsRequest,
    ListRootsResult,
    PromptReference,
    ResourceTemplateReference,
    SamplingMessage,
    SetLevelRequestParams,
    SubscribeRequestParams,
    TextContent,
    TextResourceContents,
    UnsubscribeRequestParams,
)
from mcp_types.jsonrpc import JSONRPCMessage
from pydantic import Field

from idempotency import KeyStore, idempotent, idempotent_tasks, install, open_store, wire
from mcp_once.proxy.tasks import producing_tasks

SERVER_NAME = "mcp-once-conformance-fixture"
#: The argument-keyed tool (guarded mode), and the argument its key travels in.
KEYED_TOOL = "mcp_once_keyed_record"
KEY_ARGUMENT = "idempotency_key"

#: A 1x1 red PNG and a minimal WAV file, as the suite's reference server sends them.
PNG_BASE64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAF"
    "BQIAX8jx0gAAAABJRU5ErkJggg=="
)
WAV_BASE64 = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

#: SEP-1613 / SEP-2106: listed verbatim ($schema, $defs, $anchor, additionalProperties, allOf/anyOf
#: and if/then/else must all survive the listing).
JSON_SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}

#: SEP-1034: a default for every primitive type.
DEFAULTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {
            "type": "string",
            "description": "User status",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "description": "Verification status", "default": True},
    },
    "required": [],
}

#: SEP-1330: the five enum shapes (untitled/titled single, legacy enumNames, untitled/titled multi).
ENUMS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "untitledSingle": {
            "type": "string",
            "description": "Select one option",
            "enum": ["option1", "option2", "option3"],
        },
        "titledSingle": {
            "type": "string",
            "description": "Select one option with titles",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "description": "Select one option (legacy)",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {
            "type": "array",
            "description": "Select multiple options",
            "minItems": 1,
            "maxItems": 3,
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "description": "Select multiple options with titles",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
    "required": [],
}


def _text(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)])


ToolAnswer = CallToolResult | InputRequiredResult


def _ask(message: str, field: str = "name", kind: str = "string") -> ElicitRequest:
    schema = {"type": "object", "properties": {field: {"type": kind}}, "required": [field]}
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))


def _sample(text: str, max_tokens: int) -> CreateMessageRequest:
    message = SamplingMessage(role="user", content=TextContent(type="text", text=text))
    return CreateMessageRequest(
        params=CreateMessageRequestParams(messages=[message], max_tokens=max_tokens)
    )


def _elicited(responses: Mapping[str, object] | None, key: str, field: str) -> str | None:
    """The accepted answer to elicitation `key`, or None when it is missing or not usable."""
    answer = (responses or {}).get(key)
    if not isinstance(answer, ElicitResult) or answer.action != "accept" or not answer.content:
        return None
    value = answer.content.get(field)
    return str(value) if value is not None else None


def _state(request_state: str | None) -> dict[str, Any]:
    """The plaintext `requestState` this server minted (the SDK verified and unsealed it)."""
    try:
        state = json.loads(request_state) if request_state else {}
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


class MemoryEventStore(EventStore):
    """Every SSE event of this process, so a client that reconnects with Last-Event-ID gets the
    rest of its stream (SEP-1699: `test_reconnection` closes the stream mid-call)."""

    def __init__(self) -> None:
        self._events: list[tuple[StreamId, JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        self._events.append((stream_id, message))
        return str(len(self._events))

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        if not last_event_id.isdigit() or not 0 < int(last_event_id) <= len(self._events):
            return None
        seen = int(last_event_id)
        stream_id = self._events[seen - 1][0]
        for index, (stream, message) in enumerate(self._events[seen:], start=seen + 1):
            if stream == stream_id and message is not None:  # None: a priming event
                await send_callback(EventMessage(message, str(index)))
        return stream_id


def _json_schema_tool() -> Tool:
    """`json_schema_2020_12_tool`: validated by its signature, listed with the raw 2020-12 schema
    (a signature-derived schema would rename `$defs` entries and drop `$schema`)."""

    async def json_schema_2020_12_tool(
        name: str | None = None,
        address: dict[str, str] | None = None,
        contactMethod: str | None = None,
        phone: str | None = None,
        email: str | None = None,
    ) -> CallToolResult:
        arguments = {
            "name": name,
            "address": address,
            "contactMethod": contactMethod,
            "phone": phone,
            "email": email,
        }
        shown = {key: value for key, value in arguments.items() if value is not None}
        return _text(f"JSON Schema 2020-12 tool called with: {json.dumps(shown)}")

    tool = Tool.from_function(
        json_schema_2020_12_tool,
        description="Tool with JSON Schema 2020-12 features for conformance testing (SEP-1613)",
    )
    return tool.model_copy(update={"parameters": JSON_SCHEMA_2020_12})


def _add_keyed_tool(server: MCPServer, store: KeyStore | None) -> None:
    """`mcp_once_keyed_record`: one effect per execution, numbered, so a replay shows. With a
    store it is guarded by its own `@idempotent(store, key_argument="idempotency_key")`: listed
    `idempotentHint: true` with the key argument in its schema and its place in `_meta`."""
    executions: list[str] = []

    async def mcp_once_keyed_record(note: str) -> CallToolResult:
        executions.append(note)
        return _text(f"recorded {note} (execution {len(executions)})")

    tool = mcp_once_keyed_record
    if store is not None:
        tool = idempotent(store, key_argument=KEY_ARGUMENT)(tool)
    described = "Records a note (mcp-once: keyed by a tool argument)"
    server.tool(name=KEYED_TOOL, description=described)(tool)


def build_server(store: KeyStore | None = None, tasks: TasksFixture | None = None) -> MCPServer:
    """The fixture server, unguarded but for the argument-keyed tool and the task creation of
    `tasks` (its tasks extension, `fixture_tasks`), which `store` guards when given (`main`
    guards the rest with `install`)."""
    extensions: list[Extension] = []
    if tasks is not None and store is not None:
        # Only the tools it may task are claimed there; every other call is `install()`'s.
        guarded = idempotent_tasks(tasks, store, server_name=SERVER_NAME, task_tools=TASK_TOOLS)
        extensions.append(guarded)
    elif tasks is not None:
        extensions.append(tasks)
    server = MCPServer(
        SERVER_NAME, version="1.0.0", tools=[_json_schema_tool()], extensions=extensions
    )
    subscriptions: set[str] = set()

    # ----- tools -----

    _add_keyed_tool(server, store)

    @server.tool(description="Tests simple text content response")
    async def test_simple_text() -> CallToolResult:
        return _text("This is a simple text response for testing.")

    @server.tool(description="Tests image content response")
    async def test_image_content() -> CallToolResult:
        return CallToolResult(
            content=[ImageContent(type="image", data=PNG_BASE64, mime_type="image/png")]
        )

    @server.tool(description="Tests audio content response")
    async def test_audio_content() -> CallToolResult:
        return CallToolResult(
            content=[AudioContent(type="audio", data=WAV_BASE64, mime_type="audio/wav")]
        )

    @server.tool(description="Tests embedded resource content response")
    async def test_embedded_resource() -> CallToolResult:
        resource = TextResourceContents(
            uri="test://embedded-resource",
            mime_type="text/plain",
            text="This is an embedded resource content.",
        )
        return CallToolResult(content=[EmbeddedResource(type="resource", resource=resource)])

    @server.tool(description="Tests response with multiple content types (text, image, resource)")
    async def test_multiple_content_types() -> CallToolResult:
        resource = TextResourceContents(
            uri="test://mixed-content-resource",
            mime_type="application/json",
            text=json.dumps({"test": "data", "value": 123}),
        )
        content: list[ContentBlock] = [
            TextContent(type="text", text="Multiple content types test:"),
            ImageContent(type="image", data=PNG_BASE64, mime_type="image/png"),
            EmbeddedResource(type="resource", resource=resource),
        ]
        return CallToolResult(content=content)

    @server.tool(description="Tests tool that emits log messages during execution")
    async def test_tool_with_logging(ctx: Context) -> CallToolResult:
        await ctx.info("Tool execution started")
        await anyio.sleep(0.05)
        await ctx.info("Tool processing data")
        await anyio.sleep(0.05)
        await ctx.info("Tool execution completed")
        return _text("Tool with logging executed successfully")

    @server.tool(description="Tests tool that reports progress notifications")
    async def test_tool_with_progress(ctx: Context) -> CallToolResult:
        for step in (0, 50, 100):
            if step:
                await anyio.sleep(0.05)
            await ctx.report_progress(step, 100, f"Completed step {step} of 100")
        meta = ctx.request_context.meta
        token = meta.get("progressToken") if meta is not None else None
        return _text(str(token if token is not None else 0))

    @server.tool(description="Tests error response handling")
    async def test_error_handling() -> CallToolResult:
        raise ToolError("This tool intentionally returns an error for testing")

    @server.tool(
        description="Tests SSE stream disconnection and client reconnection (SEP-1699): the"
        " server closes the stream mid-call and sends the result after the client reconnects."
    )
    async def test_reconnection(ctx: Context) -> CallToolResult:
        await ctx.close_sse_stream()
        await anyio.sleep(0.2)
        return _text(
            "Reconnection test completed successfully. If you received this, the client"
            " properly reconnected after stream closure."
        )

    @server.tool(description="Tests server-initiated sampling (LLM completion request)")
    async def test_sampling(prompt: str, ctx: Context) -> CallToolResult:
        try:
            result = await ctx.session.create_message(
                [SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
                max_tokens=100,
                related_request_id=ctx.request_context.request_id,
            )
        except Exception as exc:
            return _text(f"Sampling not supported or error: {exc}")
        blocks = result.content if isinstance(result.content, list) else [result.content]
        text = next((b.text for b in blocks if isinstance(b, TextContent)), "No response")
        return _text(f"LLM response: {text}")

    async def elicit(ctx: Context, message: str, schema: dict[str, Any], label: str) -> str:
        try:
            result = await ctx.session.elicit_form(
                message, schema, related_request_id=ctx.request_context.request_id
            )
        except Exception as exc:
            return f"Elicitation not supported or error: {exc}"
        return f"{label}: action={result.action}, content={json.dumps(result.content or {})}"

    @server.tool(description="Tests server-initiated elicitation (user input request)")
    async def test_elicitation(message: str, ctx: Context) -> CallToolResult:
        schema = {
            "type": "object",
            "properties": {"response": {"type": "string", "description": "User's response"}},
            "required": ["response"],
        }
        return _text(await elicit(ctx, message, schema, "User response"))

    @server.tool(description="Tests elicitation with default values per SEP-1034")
    async def test_elicitation_sep1034_defaults(ctx: Context) -> CallToolResult:
        message = "Please review and update the form fields with defaults"
        return _text(await elicit(ctx, message, DEFAULTS_SCHEMA, "Elicitation completed"))

    @server.tool(description="Tests elicitation with enum schema improvements per SEP-1330")
    async def test_elicitation_sep1330_enums(ctx: Context) -> CallToolResult:
        message = "Please select options from the enum fields"
        return _text(await elicit(ctx, message, ENUMS_SCHEMA, "Elicitation completed"))

    # ----- 2026-07-28 (conformance 0.2.0 alpha, `--spec-version 2026-07-28`) -----

    @server.tool(description="Test tool requiring sampling (SEP-2575: -32021 when undeclared)")
    async def test_missing_capability(ctx: Context) -> CallToolResult:
        capabilities = ctx.client_capabilities
        if capabilities is None or capabilities.sampling is None:
            raise MCPError(
                code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                message="MissingRequiredClientCapabilityError",
                data={"requiredCapabilities": {"sampling": {}}},
            )
        return _text("Success")

    @server.tool(description="Echoes a parameter that also travels as the Mcp-Param-Region header")
    async def test_custom_headers(
        region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})],
    ) -> CallToolResult:
        return _text(f"region: {region}")

    @server.tool(description="Diagnostic logging validator tool (logs only when opted in)")
    async def test_logging_tool(ctx: Context) -> CallToolResult:
        await ctx.info("Diagnostic trace logging activated")
        return _text("Logging evaluated")

    @server.tool(description="Diagnostic tool validating response progress streams")
    async def test_streaming_elicitation(ctx: Context) -> CallToolResult:
        await ctx.report_progress(50, 100)
        return _text("Streaming complete")

    @server.tool(description="Publishes a tools list-changed event to subscriptions/listen streams")
    async def test_trigger_tool_change(ctx: Context) -> CallToolResult:
        await ctx.notify_tools_changed()
        return _text("Mutation triggered")

    @server.tool(
        description="Publishes a prompts list-changed event to subscriptions/listen streams"
    )
    async def test_trigger_prompt_change(ctx: Context) -> CallToolResult:
        await ctx.notify_prompts_changed()
        return _text("Mutation triggered")

    # SEP-2322 multi-round-trip tools: round 1 answers InputRequiredResult, the client retries
    # with `inputResponses` (and the echoed `requestState`, sealed and verified by the SDK).

    @server.tool(description="MRTR: returns InputRequiredResult with elicitation request")
    async def test_input_required_result_elicitation(ctx: Context) -> ToolAnswer:
        name = _elicited(ctx.input_responses, "user_name", "name")
        if name is None:
            return InputRequiredResult(input_requests={"user_name": _ask("What is your name?")})
        return _text(f"Hello, {name}!")

    @server.tool(description="MRTR: returns InputRequiredResult with sampling request")
    async def test_input_required_result_sampling(ctx: Context) -> ToolAnswer:
        sampled = (ctx.input_responses or {}).get("sample_request")
        if not isinstance(sampled, CreateMessageResult):
            question = _sample("What is the capital of France?", 100)
            return InputRequiredResult(input_requests={"sample_request": question})
        text = sampled.content.text if isinstance(sampled.content, TextContent) else "no response"
        return _text(f"Sampling result: {text}")

    @server.tool(description="MRTR: returns InputRequiredResult with roots/list request")
    async def test_input_required_result_list_roots(ctx: Context) -> ToolAnswer:
        roots = (ctx.input_responses or {}).get("roots_request")
        if not isinstance(roots, ListRootsResult):
            return InputRequiredResult(input_requests={"roots_request": ListRootsRequest()})
        return _text(f"Found {len(roots.roots)} root(s)")

    @server.tool(description="MRTR: returns InputRequiredResult with requestState")
    async def test_input_required_result_request_state(ctx: Context) -> ToolAnswer:
        state = _state(ctx.request_state)
        confirm = (ctx.input_responses or {}).get("confirm")
        if state.get("kind") == "request-state" and isinstance(confirm, ElicitResult):
            ok = (confirm.content or {}).get("ok")
            return _text(f"state-ok: requestState validated (ok={ok})")
        return InputRequiredResult(
            input_requests={"confirm": _ask("Please confirm", "ok", "boolean")},
            request_state=json.dumps({"kind": "request-state", "nonce": uuid.uuid4().hex}),
        )

    @server.tool(description="MRTR: returns InputRequiredResult with multiple input requests")
    async def test_input_required_result_multiple_inputs(ctx: Context) -> ToolAnswer:
        responses = ctx.input_responses or {}
        name = _elicited(responses, "user_name", "name")
        greeting = responses.get("greeting")
        roots = responses.get("client_roots")
        if (
            _state(ctx.request_state).get("kind") == "multiple-inputs"
            and name is not None
            and isinstance(greeting, CreateMessageResult)
            and isinstance(roots, ListRootsResult)
        ):
            said = greeting.content.text if isinstance(greeting.content, TextContent) else "?"
            return _text(f"Name: {name}; Greeting: {said}; Roots: {len(roots.roots)}")
        return InputRequiredResult(
            input_requests={
                "user_name": _ask("What is your name?"),
                "greeting": _sample("Generate a greeting", 50),
                "client_roots": ListRootsRequest(),
            },
            request_state=json.dumps({"kind": "multiple-inputs", "nonce": uuid.uuid4().hex}),
        )

    @server.tool(description="MRTR: multi-round InputRequiredResult workflow")
    async def test_input_required_result_multi_round(ctx: Context) -> ToolAnswer:
        state = _state(ctx.request_state)
        responses = ctx.input_responses
        if state.get("round") == 1 and (name := _elicited(responses, "step1", "name")):
            return InputRequiredResult(
                input_requests={"step2": _ask("Step 2: What is your favorite color?", "color")},
                request_state=json.dumps({"round": 2, "name": name, "nonce": uuid.uuid4().hex}),
            )
        if state.get("round") == 2 and (color := _elicited(responses, "step2", "color")):
            return _text(f"Multi-round complete for {state.get('name')} who likes {color}")
        return InputRequiredResult(
            input_requests={"step1": _ask("Step 1: What is your name?")},
            request_state=json.dumps({"round": 1, "nonce": uuid.uuid4().hex}),
        )

    @server.tool(description="MRTR: requestState integrity test (the SDK seals requestState)")
    async def test_input_required_result_tampered_state(ctx: Context) -> ToolAnswer:
        confirmed = isinstance((ctx.input_responses or {}).get("confirm"), ElicitResult)
        if _state(ctx.request_state).get("kind") == "tamper-test" and confirmed:
            return _text("integrity-ok: state verified")
        return InputRequiredResult(
            input_requests={"confirm": _ask("Please confirm", "ok", "boolean")},
            request_state=json.dumps({"kind": "tamper-test", "nonce": uuid.uuid4().hex}),
        )

    @server.tool(description="MRTR: respects client capabilities in inputRequests")
    async def test_input_required_result_capabilities(ctx: Context) -> ToolAnswer:
        if ctx.input_responses:
            return _text(f"capabilities-ok: received {','.join(ctx.input_responses)}")
        capabilities = ctx.client_capabilities
        requests: dict[str, InputRequest] = {}
        if capabilities is not None and capabilities.elicitation is not None:
            requests["elicit_input"] = _ask("Elicitation input", "value")
        if capabilities is not None and capabilities.sampling is not None:
            requests["sample_input"] = _sample("Sample request", 50)
        if not requests:
            return _text("No supported capabilities declared")
        return InputRequiredResult(
            input_requests=requests,
            request_state=json.dumps({"kind": "capabilities-test", "nonce": uuid.uuid4().hex}),
        )

    @server.prompt(description="MRTR: prompt that requires elicitation input")
    async def test_input_required_result_prompt(
        ctx: Context,
    ) -> list[Message] | InputRequiredResult:
        context = _elicited(ctx.input_responses, "user_context", "context")
        if context is None:
            question = _ask("What context should the prompt use?", "context")
            return InputRequiredResult(input_requests={"user_context": question})
        return [UserMessage(f"Prompt with context: {context}")]

    # ----- resources -----

    @server.resource(
        "test://static-text",
        name="static-text",
        title="Static Text Resource",
        description="A static text resource for testing",
        mime_type="text/plain",
    )
    def static_text() -> str:
        return "This is the content of the static text resource."

    @server.resource(
        "test://static-binary",
        name="static-binary",
        title="Static Binary Resource",
        description="A static binary resource (image) for testing",
        mime_type="image/png",
    )
    def static_binary() -> bytes:
        return base64.b64decode(PNG_BASE64)

    @server.resource(
        "test://template/{id}/data",
        name="template",
        title="Resource Template",
        description="A resource template with parameter substitution",
        mime_type="application/json",
    )
    def template(id: str) -> str:
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    @server.resource(
        "test://watched-resource",
        name="watched-resource",
        title="Watched Resource",
        description="A resource clients may subscribe to",
        mime_type="text/plain",
    )
    def watched_resource() -> str:
        return "Watched resource content"

    # ----- prompts -----

    @server.prompt(title="Simple Test Prompt", description="A simple prompt without arguments")
    def test_simple_prompt() -> list[Message]:
        return [UserMessage("This is a simple prompt for testing.")]

    @server.prompt(title="Prompt With Arguments", description="A prompt with required arguments")
    def test_prompt_with_arguments(arg1: str, arg2: str) -> list[Message]:
        return [UserMessage(f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'")]

    @server.prompt(
        title="Prompt With Embedded Resource",
        description="A prompt that includes an embedded resource",
    )
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[Message]:
        resource = TextResourceContents(
            uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
        )
        return [
            UserMessage(EmbeddedResource(type="resource", resource=resource)),
            UserMessage("Please process the embedded resource above."),
        ]

    @server.prompt(title="Prompt With Image", description="A prompt that includes image content")
    def test_prompt_with_image() -> list[Message]:
        return [
            UserMessage(ImageContent(type="image", data=PNG_BASE64, mime_type="image/png")),
            UserMessage("Please analyze the image above."),
        ]

    # ----- completion, logging level, subscriptions -----

    @server.completion()  # type: ignore[no-untyped-call, untyped-decorator]
    async def complete(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion:
        return Completion(values=[], total=0, has_more=False)

    # MCPServer has no decorators for these three: the SDK's documented way is the low-level
    # server's `add_request_handler`.
    lowlevel = server._lowlevel_server

    async def set_level(
        ctx: ServerRequestContext[Any], params: SetLevelRequestParams
    ) -> EmptyResult:
        return EmptyResult()

    async def subscribe(
        ctx: ServerRequestContext[Any], params: SubscribeRequestParams
    ) -> EmptyResult:
        subscriptions.add(str(params.uri))
        return EmptyResult()

    async def unsubscribe(
        ctx: ServerRequestContext[Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        subscriptions.discard(str(params.uri))
        return EmptyResult()

    lowlevel.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
    lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)
    return server


async def guarded_tools(server: MCPServer) -> tuple[int, int]:
    """(tools listed with mcp-once's policy stamp, tools listed)."""
    tools = await server.list_tools()
    stamped = sum(1 for tool in tools if wire.IDEMPOTENCY_META in (tool.meta or {}))
    return stamped, len(tools)


def _listen(port: int) -> socket.socket:
    return socket.create_server(("127.0.0.1", port))


def _stop_when_stdin_closes(server: uvicorn.Server) -> None:
    """Shut down once stdin reaches EOF: a runner that dies, even by SIGKILL, takes us along."""

    def watch() -> None:
        sys.stdin.buffer.read()
        server.should_exit = True

    threading.Thread(target=watch, name="stdin-watch", daemon=True).start()


async def serve(
    server: MCPServer,
    store: KeyStore | None,
    tasks: TasksFixture,
    port: int,
    label: str,
    stdin_eof_stops: bool,
) -> None:
    stamped, total = await guarded_tools(server)
    expected = total if store is not None else 0
    if stamped != expected:
        raise SystemExit(f"fixture: {stamped} of {total} tools guarded, expected {expected}")
    app = server.streamable_http_app(
        host="127.0.0.1", event_store=MemoryEventStore(), retry_interval=100
    )
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    http = uvicorn.Server(config)
    if stdin_eof_stops:
        _stop_when_stdin_closes(http)
    sock = _listen(port)
    host, bound = sock.getsockname()[:2]
    print(
        f"conformance fixture at http://{host}:{bound}/mcp ({label}; {stamped}/{total} tools"
        " guarded)",
        flush=True,
    )
    try:
        # The tasks' bodies run in `tasks.running()`; the front produces a `CreateTaskResult`
        # as the extension returns it (`producing_tasks`).
        with sock, producing_tasks():
            async with tasks.running():
                await http.serve(sockets=[sock])
    finally:
        if store is not None:
            with anyio.CancelScope(shield=True):
                await store.aclose()


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (%(default)s)")
    parser.add_argument(
        "--unguarded", action="store_true", help="serve the same server without mcp-once"
    )
    parser.add_argument(
        "--stop-on-stdin-eof",
        action="store_true",
        help="shut down when stdin closes (the runner keeps a pipe open)",
    )
    parser.add_argument(
        "--store",
        help="key store URL for the guarded server (default: SQLite in a temporary directory)",
    )
    args = parser.parse_args(argv)
    # The 2025 suite exercises what the 2026-07-28 revision deprecates (logging, sampling).
    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it: end with SystemExit instead of
    # the default action, so that the temporary store directory is removed.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with contextlib.ExitStack() as cleanup:
        store: KeyStore | None = None
        tasks = TasksFixture()
        if args.unguarded:
            label = "unguarded"
            server = build_server(tasks=tasks)
        else:
            if args.store:
                url, shown = args.store, args.store
            else:
                tmp = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="mcp-once-conf-"))
                url, shown = str(Path(tmp) / "keys.sqlite3"), "SQLite (temporary)"
            store = open_store(url)
            # The argument-keyed tool brings its own policy; task creation is guarded by
            # `idempotent_tasks` around the tasks extension.
            server = build_server(store, tasks)
            install(server, store)  # default options: every other tool, keys="derived"
            label = f"guarded by install(), store {shown}"
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl-C it handled
            anyio.run(serve, server, store, tasks, args.port, label, args.stop_on_stdin_eof)
    return 0


if __name__ == "__main__":
    sys.exit(main())
