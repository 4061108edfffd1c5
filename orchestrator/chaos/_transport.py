"""The faulty link: a client transport that relays another one and breaks requests on plan.

Shape: the client writes into `_ChaosWriter.send`, which decides the request's fault in the
writer's own task (so a close-before-write can fail that very write, as a dead pipe would) and
queues it (the write returns at once, as into a socket buffer). One outbound pump forwards the
queue to the inner transport, applying request delays, duplicates and close-after-write; one
inbound pump forwards the inner transport's messages to the client, swallowing and delaying
responses. Both pumps are FIFO: a delay holds back what follows, it never reorders. A dead link
is modelled by closing streams (the client's dispatcher then fails every waiter with
CONNECTION_CLOSED, -32000), never by cancelling anyone but our own pumps.

The link draws its faults from the run that made it, through `ChaosRun`: `Chaos` makes links
(`Chaos.wrap`), so the link names only what it asks of the run, and `ChaosTransport` (in
`_chaos`, beside `Chaos`) is this link with its `chaos` typed as the `Chaos` it is.
"""

from __future__ import annotations

import contextvars
import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from types import TracebackType
from typing import TYPE_CHECKING, Final, Protocol, TypeVar

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCRequest, JSONRPCResponse, RequestId

from orchestrator.chaos._plan import Fault, FaultPlan
from orchestrator.chaos._record import FaultRecord, count_by_kind
from orchestrator.chaos._streams import ContextReceiver, ContextSender, Envelope

if TYPE_CHECKING:
    from mcp.client._transport import ReadStream, Transport, TransportStreams, WriteStream

__all__ = ["ChaosRun", "FaultyLink"]

logger = logging.getLogger("orchestrator.chaos")

_FLUSH_GRACE_SECONDS: Final = 0.5
"""On exit, how long the outbound pump may take to hand already-written messages to the inner
transport before it is cancelled."""

_DUPLICATE_ID_PREFIX: Final = "mcp-once-chaos-dup"

_S = TypeVar("_S")


class ChaosRun(Protocol):
    """What a link asks of the run that made it (`Chaos` is the one implementation)."""

    @property
    def plan(self) -> FaultPlan: ...

    def _decide(
        self, *, method: str, tool: str | None, request_id: RequestId, connection: int
    ) -> FaultRecord | None: ...

    def _swallowing(self, count: int) -> None: ...

    def _swallowed(self, count: int) -> None: ...


class _Outgoing:
    """A client message on its way to the inner transport, with the fault decided for it."""

    __slots__ = ("context", "delay", "duplicate_id", "item", "kind")

    def __init__(
        self,
        item: SessionMessage,
        context: contextvars.Context,
        kind: Fault | None,
        delay: float | None,
        duplicate_id: str | None,
    ) -> None:
        self.item = item
        self.context = context
        self.kind = kind
        self.delay = delay
        self.duplicate_id = duplicate_id


def _tool_name(request: JSONRPCRequest) -> str | None:
    if request.method != "tools/call" or not isinstance(request.params, dict):
        return None
    name = request.params.get("name")
    return name if isinstance(name, str) else None


def _response_id(item: SessionMessage | Exception) -> RequestId | None:
    if isinstance(item, SessionMessage) and isinstance(
        item.message, JSONRPCResponse | JSONRPCError
    ):
        return item.message.id
    return None


async def _send_in_context(
    context: contextvars.Context, stream: WriteStream[SessionMessage], item: SessionMessage
) -> None:
    """Send from a task born in the writer's context, so context-aware inner streams capture it.

    This is how the SDK's own HTTP transport keeps a request's timeout clock (a ContextVar)
    reachable below `send`; a relay that sent from its pump task would lose it.
    """
    failures: list[Exception] = []

    async def send() -> None:
        try:
            await stream.send(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        context.run(tg.start_soon, send)
    if failures:
        raise failures[0]


class _ChaosWriter:
    """The write stream handed to the client: every message goes through `_accept`."""

    def __init__(self, link: FaultyLink) -> None:
        self._link = link

    async def send(self, item: SessionMessage, /) -> None:
        await self._link._accept(item)

    async def aclose(self) -> None:
        self._link._client_closed_write()
        await anyio.lowlevel.checkpoint()

    async def __aenter__(self) -> _ChaosWriter:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class FaultyLink:
    """The relay behind `ChaosTransport`: relays `inner`, injecting the faults `run` decides."""

    def __init__(self, inner: Transport, run: ChaosRun, connection: int) -> None:
        self._inner = inner
        self._run = run
        self._connection = connection
        self._faults: list[FaultRecord] = []
        self._entered = False
        self._dead = False
        self._write_closed = False
        self._delaying = False
        self._client_gone = False
        self._swallow: set[RequestId] = set()
        self._response_delays: dict[RequestId, float] = {}
        self._stack: AsyncExitStack | None = None
        self._queue_send: MemoryObjectSendStream[_Outgoing] | None = None
        self._queue_receive: MemoryObjectReceiveStream[_Outgoing] | None = None
        self._to_client: ContextSender[SessionMessage | Exception] | None = None
        self._client_read: ContextReceiver[SessionMessage | Exception] | None = None
        self._pump_done: anyio.Event | None = None

    # -- public surface ------------------------------------------------------------------------

    @property
    def connection(self) -> int:
        """1-based number of this transport among its `Chaos`'s wraps."""
        return self._connection

    @property
    def faults(self) -> tuple[FaultRecord, ...]:
        """The faults injected on this connection, in decision order."""
        return tuple(self._faults)

    def fault_counts(self) -> dict[Fault, int]:
        """How many faults of each kind this connection injected (every kind present)."""
        return count_by_kind(self._faults)

    @property
    def closed(self) -> bool:
        """True once the link is dead: a close fault, the inner transport ending, or exit."""
        return self._dead

    async def __aenter__(self) -> TransportStreams:
        if self._entered:
            raise RuntimeError(
                "a ChaosTransport is single-use, like the sessions it carries; "
                "call Chaos.wrap() on a new inner transport to reconnect"
            )
        self._entered = True
        async with AsyncExitStack() as stack:
            inner_read, inner_write = await stack.enter_async_context(self._inner)
            tg = await stack.enter_async_context(anyio.create_task_group())
            # Unbounded, like a socket's send buffer: a client write never waits out an injected
            # delay (the SDK bounds its courtesy-cancel write at 5 s and would stall on it).
            queue = anyio.create_memory_object_stream[_Outgoing](math.inf)
            self._queue_send, self._queue_receive = queue
            to_client, client_read = anyio.create_memory_object_stream[
                Envelope[SessionMessage | Exception]
            ](0)
            self._to_client = ContextSender(to_client)
            self._client_read = ContextReceiver(client_read)
            self._pump_done = anyio.Event()
            tg.start_soon(self._guarded, self._outbound, inner_write)
            tg.start_soon(self._guarded, self._inbound, inner_read)
            stack.push_async_callback(self._shutdown, tg)
            self._stack = stack.pop_all()
        read: ReadStream[SessionMessage | Exception] = self._client_read
        write: WriteStream[SessionMessage] = _ChaosWriter(self)
        return read, write

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        stack, self._stack = self._stack, None
        if stack is None:
            return None
        return await stack.__aexit__(exc_type, exc_val, exc_tb)

    # -- the client's write path -------------------------------------------------------------

    async def _accept(self, item: SessionMessage) -> None:
        """Decide the fault for a client message in the writer's task, then queue it."""
        if self._write_closed:
            raise anyio.ClosedResourceError
        if self._dead:
            raise anyio.BrokenResourceError
        assert self._queue_send is not None
        message = item.message
        record: FaultRecord | None = None
        if isinstance(message, JSONRPCRequest):
            tool = _tool_name(message)
            if self._run.plan.matches(message.method, tool):
                record = self._run._decide(
                    method=message.method,
                    tool=tool,
                    request_id=message.id,
                    connection=self._connection,
                )
        if record is None:
            await self._queue_send.send(
                _Outgoing(item, contextvars.copy_context(), None, None, None)
            )
            return
        self._faults.append(record)
        duplicate_id: str | None = None
        if record.kind is Fault.CLOSE_BEFORE_WRITE:
            self._die()
            raise anyio.BrokenResourceError
        if record.kind is Fault.LOST_ACK:
            self._expect_swallow(record.request_id)
        elif record.kind is Fault.DELAY_RESPONSE and record.delay_seconds is not None:
            self._response_delays[record.request_id] = record.delay_seconds
        elif record.kind is Fault.DUPLICATE:
            # A fresh id: JSON-RPC forbids reusing an in-flight id, and the SDK's HTTP transport
            # treats a reused id as superseding (and aborting) the first POST.
            duplicate_id = f"{_DUPLICATE_ID_PREFIX}-{self._connection}-{record.index}"
            self._expect_swallow(duplicate_id)
        outgoing = _Outgoing(
            item, contextvars.copy_context(), record.kind, record.delay_seconds, duplicate_id
        )
        await self._queue_send.send(outgoing)

    def _client_closed_write(self) -> None:
        """The client is done writing: the pump flushes what is queued and stops."""
        self._write_closed = True
        if self._queue_send is not None:
            self._queue_send.close()

    # -- pumps -------------------------------------------------------------------------------

    async def _guarded(self, pump: Callable[[_S], Awaitable[None]], stream: _S) -> None:
        """Run a pump so nothing it raises can cancel the task group the user's code sits in."""
        try:
            await pump(stream)
        except Exception:
            logger.exception("chaos link %d: relay failed; closing the link", self._connection)
            self._die()

    async def _outbound(self, inner_write: WriteStream[SessionMessage]) -> None:
        assert self._queue_receive is not None and self._pump_done is not None
        try:
            async for outgoing in self._queue_receive:
                if outgoing.kind is Fault.DELAY_REQUEST and outgoing.delay is not None:
                    self._delaying = True
                    await anyio.sleep(outgoing.delay)
                    self._delaying = False
                if self._dead:
                    break  # the link died while this message waited: it is never delivered
                if outgoing.kind is Fault.DROP_REQUEST:
                    continue
                await _send_in_context(outgoing.context, inner_write, outgoing.item)
                if outgoing.kind is Fault.DUPLICATE and outgoing.duplicate_id is not None:
                    request = outgoing.item.message
                    copy = SessionMessage(
                        message=request.model_copy(update={"id": outgoing.duplicate_id}),
                        metadata=outgoing.item.metadata,
                    )
                    await _send_in_context(outgoing.context, inner_write, copy)
                elif outgoing.kind is Fault.CLOSE_AFTER_WRITE:
                    self._die()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            # `_die` closed the queue under us, or the inner transport stopped taking messages.
            self._die()
        finally:
            # The inner write stream is deliberately left open: the inner transport's own exit
            # ends it. Closing it here (a half-close) makes the SDK's streamable-HTTP transport
            # close its read side under in-flight POSTs, which then fail out of its task group.
            self._pump_done.set()

    async def _inbound(self, inner_read: ReadStream[SessionMessage | Exception]) -> None:
        assert self._to_client is not None
        try:
            while True:
                try:
                    item = await inner_read.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError):
                    return
                if self._dead or self._client_gone:
                    continue  # keep draining so the inner transport is never blocked on us
                context: contextvars.Context | None = getattr(inner_read, "last_context", None)
                response_id = _response_id(item)
                if response_id is not None:
                    if response_id in self._swallow:
                        self._swallow.discard(response_id)
                        self._run._swallowed(1)
                        continue
                    delay = self._response_delays.pop(response_id, None)
                    if delay is not None:
                        await anyio.sleep(delay)
                        if self._dead:
                            continue
                try:
                    await self._to_client.send(item, context)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    self._client_gone = True
        finally:
            # The inner transport ended (or we are torn down): the client must see a closed link.
            self._die()

    # -- link state --------------------------------------------------------------------------

    def _expect_swallow(self, request_id: RequestId) -> None:
        self._swallow.add(request_id)
        self._run._swallowing(1)

    def _die(self) -> None:
        """Kill the link: EOF to the client, refuse further writes, forget pending swallows."""
        if self._dead:
            return
        self._dead = True
        if self._to_client is not None:
            self._to_client.close()
        if self._queue_receive is not None:
            self._queue_receive.close()
        pending = len(self._swallow)
        self._swallow.clear()
        self._response_delays.clear()
        self._run._swallowed(pending)

    async def _shutdown(self, tg: anyio.abc.TaskGroup) -> None:
        with anyio.CancelScope(shield=True):
            self._client_closed_write()
            # Flush what the client already wrote, unless it is held in a request delay: a
            # connection that is going away does not wait out injected latency.
            if self._pump_done is not None and not self._delaying:
                with anyio.move_on_after(_FLUSH_GRACE_SECONDS):
                    await self._pump_done.wait()
            self._die()
            if self._client_read is not None:
                self._client_read.close()
            tg.cancel_scope.cancel()
