"""The `--listen` front's answers: JSON when a request's own answer is its first message.

Why: the SDK's streamable HTTP transport (the handshake eras) answers every request POST as an
SSE stream, so that whatever a call sends before its answer (progress, log lines, the upstream's
sampling and elicitation questions) has a wire; the stream costs an sse-starlette response, its
task group and tasks and a stream of events per answer, where most calls send nothing but their
answer (benchmarks/README.md, issue 46, "JSON when the answer comes first"). The spec lets a
server answer a POST whose Accept lists both types with either. The SDK's own JSON mode
(`json_response=True`) answers JSON always, and drops everything else the call sends: not
acceptable for a proxy that forwards those messages.

So this transport holds a request's response headers until its first message: its own answer (a
result or an error for its id) is answered `application/json`; anything else (a notification, a
request to the caller) opens the SSE stream exactly as the SDK does, that message first. A call
that sends nothing for `HOLD` seconds gets its SSE stream (and the stream's pings) then, as the
SDK's 2026-07-28 path does, so an idle-read timeout between the caller and the proxy cuts a long
quiet call no sooner than the SDK's stream would. A request whose stream starts with a priming
event (an event store, a resumable client) is answered as the SDK answers it, at once. The
2026-07-28 era is served by the SDK's own path, which already defers the same way; the legacy
stateless mode (`stateless_http`, which the proxy does not use) keeps the SDK's transport.

The hook: FastMCP's HTTP app builds its session manager in its lifespan, and the manager builds
each session's transport by name; neither takes a factory. `held_front` wraps the app's lifespan
and turns the manager FastMCP built into `HeldFrontManager`, whose sessions get
`HeldFrontTransport`: both subclasses override methods only (no state of their own), so only this
app's sessions change, and nothing in the SDK's or FastMCP's modules is replaced.
`_handle_post_request` is the SDK's (mcp 2.3.0, mcp/server/streamable_http.py, lines 558-726)
without its JSON-mode branch (644-673: with `json_response` set the SDK's whole method runs) and
with its SSE branch (674-714) replaced by `_answer` and `_stream`; tests/proxy/
test_proxy_http_front.py pins that method's source (and `_run_sse_writer`'s, `_admit_session`'s)
by hash, so an SDK upgrade that changes them fails loudly.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from functools import partial
from http import HTTPStatus
from typing import Any

import anyio
import pydantic_core
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from fastmcp.server.http import (
    FastMCPStreamableHTTPSessionManager,
    StarletteWithLifespan,
    StreamableHTTPASGIApp,
)
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.streamable_http import (
    CONTENT_TYPE_SSE,
    MCP_SESSION_ID_HEADER,
    REQUEST_STREAM_BUFFER_SIZE,
    EventMessage,
    SSEEvent,
    StreamableHTTPServerTransport,
)
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.message import SessionMessage
from mcp_types import (
    DEFAULT_NEGOTIATED_VERSION,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    PARSE_ERROR,
    JSONRPCError,
    JSONRPCRequest,
    JSONRPCResponse,
    jsonrpc_message_adapter,
)
from pydantic import ValidationError
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

logger = logging.getLogger("mcp_once.proxy")

#: Seconds a request's headers are held for its first message: sse-starlette's ping interval,
#: the first byte the SDK's own stream would send after its headers for a quiet call.
HOLD = 15.0


class HeldFrontTransport(StreamableHTTPServerTransport):
    """The SDK's transport, a request's answer sent as JSON when it is the request's first
    message (the module's docstring says why)."""

    async def _handle_post_request(
        self, scope: Scope, request: Request, receive: Receive, send: Send
    ) -> None:
        # The SDK's method (mcp 2.3.0), its JSON-mode branch left to the SDK and its SSE branch
        # replaced by `_answer`; the pin test holds the copy to the SDK's source.
        if self.is_json_response_enabled:
            await super()._handle_post_request(scope, request, receive, send)
            return
        writer = self._read_stream_writer
        if writer is None:  # pragma: no cover
            raise ValueError("No read stream writer available. Ensure connect() is called first.")
        try:
            if not await self._validate_accept_header(request, scope, send):
                return
            if not self._check_content_type(request):  # pragma: no cover
                response = self._create_error_response(
                    "Unsupported Media Type: Content-Type must be application/json",
                    HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                )
                await response(scope, receive, send)
                return
            body = await request.body()
            try:
                raw_message = pydantic_core.from_json(body)
            except ValueError as e:
                response = self._create_error_response(
                    f"Parse error: {e!s}", HTTPStatus.BAD_REQUEST, PARSE_ERROR
                )
                await response(scope, receive, send)
                return
            try:
                message = jsonrpc_message_adapter.validate_python(raw_message, by_name=False)
            except ValidationError as e:
                response = self._create_error_response(
                    f"Validation error: {e!s}", HTTPStatus.BAD_REQUEST, INVALID_PARAMS
                )
                await response(scope, receive, send)
                return
            is_initialization_request = (
                isinstance(message, JSONRPCRequest) and message.method == "initialize"
            )
            if is_initialization_request:
                if self.mcp_session_id:
                    request_session_id = self._get_session_id(request)
                    if (
                        request_session_id and request_session_id != self.mcp_session_id
                    ):  # pragma: no cover
                        response = self._create_error_response(
                            "Not Found: Invalid or expired session ID", HTTPStatus.NOT_FOUND
                        )
                        await response(scope, receive, send)
                        return
            elif not await self._validate_request_headers(request, send):
                return
            if not isinstance(message, JSONRPCRequest):
                response = self._create_json_response(None, HTTPStatus.ACCEPTED)
                await response(scope, receive, send)
                await writer.send(SessionMessage(message, metadata=self._message_metadata(request)))
                return
            protocol_version = (
                str(message.params.get("protocolVersion", DEFAULT_NEGOTIATED_VERSION))
                if is_initialization_request and message.params
                else request.headers.get(MCP_PROTOCOL_VERSION_HEADER, DEFAULT_NEGOTIATED_VERSION)
            )
            await self._answer(
                scope, request, receive, send, message, str(message.id), protocol_version
            )
        except Exception as err:
            logger.exception("Error handling POST request")
            response = self._create_error_response(
                "Error handling POST request", HTTPStatus.INTERNAL_SERVER_ERROR, INTERNAL_ERROR
            )
            await response(scope, receive, send)
            await writer.send(Exception(err))

    async def _answer(
        self,
        scope: Scope,
        request: Request,
        receive: Receive,
        send: Send,
        message: JSONRPCRequest,
        request_id: str,
        protocol_version: str,
    ) -> None:
        """Dispatch `message` and answer it: JSON if its answer comes first, else SSE with the
        first message first (the SDK's stream from the priming event on, when there is one)."""
        # Minted before any per-request state, as the SDK does: the event store is user code.
        priming_event = await self._mint_priming_event(request_id, protocol_version)
        streams = anyio.create_memory_object_stream[EventMessage](REQUEST_STREAM_BUFFER_SIZE)
        self._request_streams[request_id] = streams
        dispatched = self._create_session_message(message, request, request_id, protocol_version)
        if priming_event is not None:
            await self._stream(
                scope, receive, send, request_id, streams[1], priming_event, dispatched
            )
            return
        assert self._read_stream_writer is not None  # checked by the caller
        first: EventMessage | None = None
        try:
            await self._read_stream_writer.send(dispatched)
            with anyio.move_on_after(HOLD):
                # Closed before anything came (the session ended): the SDK's stream ends empty.
                with suppress(anyio.EndOfStream, anyio.ClosedResourceError):
                    first = await streams[1].receive()
        except BaseException:  # the session's end, or this request cancelled: nothing to answer
            with anyio.CancelScope(shield=True):
                await self._clean_up_memory_streams(request_id)
            raise
        if first is not None and isinstance(first.message, JSONRPCResponse | JSONRPCError):
            await self._clean_up_memory_streams(request_id)
            await self._create_json_response(first.message)(scope, receive, send)
            return
        opening = None if first is None else self._create_event_data(first)
        await self._stream(scope, receive, send, request_id, streams[1], opening, None)

    async def _stream(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        request_id: str,
        request_stream_reader: MemoryObjectReceiveStream[EventMessage],
        opening: SSEEvent | None,
        dispatched: SessionMessage | None,
    ) -> None:
        """The SDK's SSE answer: `opening` first, then the request's messages up to its answer;
        `dispatched` sent once the stream has started (None: already sent)."""
        sse_stream_writer: MemoryObjectSendStream[SSEEvent]
        sse_stream_writer, sse_stream_reader = anyio.create_memory_object_stream[SSEEvent](0)
        self._sse_stream_writers[request_id] = sse_stream_writer
        headers = {
            "Cache-Control": "no-cache, no-transform",
            "Connection": "keep-alive",
            "Content-Type": CONTENT_TYPE_SSE,
            **({MCP_SESSION_ID_HEADER: self.mcp_session_id} if self.mcp_session_id else {}),
        }
        response = EventSourceResponse(
            content=sse_stream_reader,
            data_sender_callable=partial(
                self._run_sse_writer, request_id, sse_stream_writer, request_stream_reader, opening
            ),
            headers=headers,
        )
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(response, scope, receive, send)
                if dispatched is not None:
                    assert self._read_stream_writer is not None  # checked by the caller
                    await self._read_stream_writer.send(dispatched)
        except Exception:  # pragma: no cover  (as the SDK's)
            logger.exception("SSE response error")
            await sse_stream_writer.aclose()
            await self._clean_up_memory_streams(request_id)
        finally:
            await sse_stream_reader.aclose()


class HeldFrontManager(FastMCPStreamableHTTPSessionManager):
    """FastMCP's session manager, its sessions served by `HeldFrontTransport`."""

    def _admit_session(
        self, requestor: AuthorizationContext | None
    ) -> StreamableHTTPServerTransport | None:
        transport = super()._admit_session(requestor)
        if transport is not None:
            # The SDK builds the transport by name; the subclass adds methods only.
            transport.__class__ = HeldFrontTransport
        return transport


def held_front(app: StarletteWithLifespan) -> StarletteWithLifespan:
    """`app` (FastMCP's streamable HTTP app) with its sessions served by `HeldFrontTransport`:
    its lifespan wrapped so that the session manager FastMCP builds there is a
    `HeldFrontManager`. An app with no streamable HTTP endpoint (FastMCP's SSE app) is returned
    as it is."""
    endpoint = _endpoint(app)
    if endpoint is None:
        return app
    built = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(served: Any) -> AsyncIterator[Any]:
        async with built(served) as state:
            manager = endpoint.session_manager
            if type(manager) is not FastMCPStreamableHTTPSessionManager:
                raise RuntimeError(
                    f"FastMCP's HTTP app built a {type(manager).__name__}, not the"
                    " FastMCPStreamableHTTPSessionManager mcp_once.proxy.http_front was written"
                    " for: re-check HeldFrontManager against it"
                )
            manager.__class__ = HeldFrontManager
            yield state

    app.router.lifespan_context = lifespan
    return app


def _endpoint(app: StarletteWithLifespan) -> StreamableHTTPASGIApp | None:
    """The streamable HTTP endpoint among `app`'s routes (behind FastMCP's auth, if any)."""
    for route in app.routes:
        if not isinstance(route, Route):
            continue
        endpoint = route.endpoint
        inner = getattr(endpoint, "app", None)  # RequireAuthMiddleware
        for candidate in (endpoint, inner):
            if isinstance(candidate, StreamableHTTPASGIApp):
                return candidate
    return None
