"""A memory stream that carries each message's sender context across the relay.

The SDK runs an inbound message in the context of the task that sent it (duck-typed through a
`last_context` attribute on the read stream): that is how an elicitation arriving during a tool
call pauses that call's timeout clock. A relay that re-sent messages from its own task would cut
that thread, so the chaos link hands the original context through.
"""

from __future__ import annotations

import contextvars
from types import TracebackType
from typing import Generic, TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = ["ContextReceiver", "ContextSender", "Envelope"]

T = TypeVar("T")

Envelope = tuple[contextvars.Context, T]


class ContextSender(Generic[T]):
    """Send side: the caller names the context the message travels with."""

    def __init__(self, inner: MemoryObjectSendStream[Envelope[T]]) -> None:
        self._inner = inner

    async def send(self, item: T, context: contextvars.Context | None = None) -> None:
        await self._inner.send(
            (context if context is not None else contextvars.copy_context(), item)
        )

    def close(self) -> None:
        self._inner.close()


class ContextReceiver(Generic[T]):
    """Receive side, shaped like the SDK's `ReadStream`, exposing `last_context`."""

    def __init__(self, inner: MemoryObjectReceiveStream[Envelope[T]]) -> None:
        self._inner = inner
        self.last_context: contextvars.Context | None = None

    async def receive(self) -> T:
        context, item = await self._inner.receive()
        self.last_context = context
        return item

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        self._inner.close()
        await anyio.lowlevel.checkpoint()

    def __aiter__(self) -> ContextReceiver[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> ContextReceiver[T]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()
