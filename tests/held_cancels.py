"""Giving up on a call the way a real client does, deterministically: its read timeout fires and
the SDK sends the courtesy `notifications/cancelled`, held back (`HoldCancels`) until the tool has
started, so that the give-up always reaches a call that runs (rule 15's re-send after a lost
answer). Shared by the server tests (`tests/server/test_resends.py`) and the proxy's."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import anyio
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCNotification

#: The client's read timeout when it gives up. Its length decides nothing: the courtesy cancel
#: it sends is held back until the tool has started (`HoldCancels`).
GIVE_UP = 0.05


def is_cancel(item: SessionMessage) -> bool:
    message = item.message
    return isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled"


class Relayed:
    """A stream that wraps `self._inner`: closing it closes the inner one, and it is its own
    async context manager, as the SDK's streams are."""

    _inner: Any

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class HeldWriter(Relayed):
    """The write stream a client session writes into: a `notifications/cancelled` waits for the
    release event (bounded: the SDK gives up that write after 5 s, and the test then fails);
    everything else passes at once, in the writer's own task and context (the HTTP transport
    reads its clock from there)."""

    def __init__(self, inner: Any, release: Callable[[], anyio.Event]) -> None:
        self._inner = inner
        self._release = release

    async def send(self, item: SessionMessage, /) -> None:
        if is_cancel(item):
            await self._release().wait()
        await self._inner.send(item)


class HoldCancels:
    """A client transport relaying `inner`, holding each courtesy `notifications/cancelled` the
    session sends until `release()` is set: a give-up then always reaches a tool that started
    (a cancel that overtakes the tool's start cancels a call that never ran, which is no
    re-send). Other writes pass a held cancel; the give-up's call returns only once its cancel
    is written, so whatever a test writes after that call comes after the cancel."""

    def __init__(self, inner: Any, release: Callable[[], anyio.Event]) -> None:
        self._inner = inner
        self._release = release

    async def __aenter__(self) -> Any:
        read, write = await self._inner.__aenter__()
        return read, HeldWriter(write, self._release)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        result: bool | None = await self._inner.__aexit__(exc_type, exc_val, exc_tb)
        return result
