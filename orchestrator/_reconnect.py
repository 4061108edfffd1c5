"""Keep one live session per server, replacing a dead one through the user's `connect` factory.

SDK sessions are single-use: once the transport closes, every call fails at once. The slot holds
the current session and a generation number; a caller that finds it dead asks for a replacement,
and every caller that asks while one is being made waits for that same one (one reconnection per
death, however many callers noticed).

Sessions made by `connect` are entered in a host task the slot owns, not in the caller's task:
the session then outlives the call that caused it, and when its transport fails the failure ends
the host task instead of cancelling an unrelated caller (a crashed streamable HTTP transport
cancels whatever runs inside its `async with`). The caller sees an ordinary "Connection closed".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

import anyio
import anyio.abc

from . import _telemetry as telemetry
from ._http import ConnectWatch, current_connect, transport_failure
from ._sessions import SessionLike, tool_session

logger = logging.getLogger("orchestrator")

#: The connect factory: each call returns a fresh async context manager whose `__aenter__` yields
#: a ready session (handshake done), e.g. `lambda: Client(url)`. The slot enters it in a task of
#: its own and exits it when the session is replaced or the `RetryingSession` closes.
Connect = Callable[[], AbstractAsyncContextManager[SessionLike]]


class ReconnectFailed(Exception):
    """The connect factory could not open a session, so the attempt was never sent.

    Raised by `SessionSlot.acquire` (and so by `RetryingSession.refresh_tools`); a tool call
    never lets it out: it is the last error (and the `__cause__`) of the `NotExecuted` that ends
    a call no session could be opened for, with or without a `Run`. Its message says why, and
    its `__cause__` is what the factory raised, a transport failure as the `TransportFailed` it
    is (connection refused, no such host, TLS, timeout: with the URL, credentials redacted),
    not the exception group or the stand-in error the SDK wraps it in.
    """


class SessionUnavailable(Exception):
    """The session is closed and there is no connect factory to replace it."""


def transport_closed(session: SessionLike) -> bool:
    """Whether the session can no longer send (SDK internals, read defensively).

    Both SDK dispatchers refuse to send once closed; reading that flag before an attempt is what
    lets a request on a session that was already dead count as never sent. Unknown means open:
    the attempt is then classified by how it fails.
    """
    return tool_session(session).closed()


def _leaves(error: BaseException) -> list[str]:
    """What a failed connect raised, as a message can say it: the exceptions inside the SDK's
    task-group wrappers ("unhandled errors in a TaskGroup" says nothing of what happened)."""
    if isinstance(error, BaseExceptionGroup):
        return [said for inner in error.exceptions for said in _leaves(inner)]
    return [f"{type(error).__name__}: {error}" if str(error) else type(error).__name__]


@dataclass(eq=False)
class _Hosted:
    generation: int
    release: anyio.Event = field(default_factory=anyio.Event)
    closed: bool = False


@dataclass(eq=False)
class _PendingConnect:
    dead_generation: int
    done: anyio.Event = field(default_factory=anyio.Event)
    error: Exception | None = None
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)


class _BadFactory(TypeError):
    pass


class SessionSlot:
    """The current session, its generation, and the machinery to replace it.

    The reconnection half of `RetryingSession`, public for retry loops of one's own (the
    `mcp-once` demo's naive baseline reconnects through it, exactly as `RetryingSession` does).
    `session` is used as given (None: connect first); with `connect`, enter the slot (`async
    with`), which hosts and finally closes the sessions it opens. `acquire()` returns a live
    session and its generation, replacing a dead one first (one reconnection per death, shared
    by every caller waiting); `mark_dead(generation)` reports that a call found that session
    dead; `connects` counts the sessions `connect` opened.
    """

    def __init__(
        self,
        session: SessionLike | None,
        connect: Connect | None,
        *,
        connect_timeout: float,
        on_new_session: Callable[[SessionLike], None] | None = None,
    ) -> None:
        self._session = session
        self._generation = 0
        self._dead = session is None
        self._connect = connect
        self._connect_timeout = connect_timeout
        self._on_new_session = on_new_session
        self._pending: _PendingConnect | None = None
        self._deaths: set[int] = set()
        self._hosted: dict[int, _Hosted] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._closing = False
        #: connect() calls made, and how many yielded a session.
        self.connect_calls = 0
        self.connects = 0

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def can_reconnect(self) -> bool:
        return self._connect is not None

    @property
    def entered(self) -> bool:
        return self._tg is not None

    def current(self) -> SessionLike | None:
        return self._session

    async def __aenter__(self) -> SessionSlot:
        if self._tg is not None:
            raise RuntimeError("this RetryingSession is already entered")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._closing = False
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        tg, self._tg = self._tg, None
        self._closing = True
        if self._pending is not None:
            self._pending.scope.cancel()
        for hosted in self._hosted.values():
            hosted.release.set()
        if tg is not None:
            await tg.__aexit__(None, None, None)

    def mark_dead(self, generation: int) -> bool:
        """The session of `generation` failed in a way that ends it; True for the first report."""
        if generation not in self._deaths:
            self._deaths.add(generation)
            if generation == self._generation:
                logger.debug("session generation %d is dead", generation)
                self._dead = True
            return True
        return False

    def usable(self) -> bool:
        session = self._session
        if session is None or self._dead:
            return False
        hosted = self._hosted.get(self._generation)
        if (hosted is not None and hosted.closed) or transport_closed(session):
            self._dead = True
            return False
        return True

    async def acquire(self) -> tuple[SessionLike, int]:
        """A live session and its generation, replacing a dead one first (shared by callers).

        Raises `SessionUnavailable` without a connect factory, `ReconnectFailed` when the factory
        fails (the caller's attempt was never sent).
        """
        while True:
            if self.usable():
                assert self._session is not None
                return self._session, self._generation
            if self._connect is None:
                raise SessionUnavailable("the session is closed and no connect factory was given")
            if self._tg is None:
                raise RuntimeError(
                    "a RetryingSession with connect= must be entered (`async with`) before use:"
                    " it owns the sessions it opens"
                )
            if self._closing:
                raise SessionUnavailable("the RetryingSession is closing")
            pending = self._pending
            if pending is None or pending.dead_generation != self._generation:
                pending = _PendingConnect(self._generation)
                self._pending = pending
                self._tg.start_soon(self._reconnect, pending)
            await pending.done.wait()
            if isinstance(pending.error, _BadFactory):
                raise TypeError(str(pending.error))
            if pending.error is not None:
                said = "; ".join(_leaves(pending.error))
                raise ReconnectFailed(f"could not open a new session: {said}") from pending.error

    async def _reconnect(self, pending: _PendingConnect) -> None:
        assert self._tg is not None and self._connect is not None
        tg = self._tg
        try:
            with pending.scope:
                with anyio.fail_after(self._connect_timeout):
                    self.connect_calls += 1
                    manager = self._connect()
                    if not (hasattr(manager, "__aenter__") and hasattr(manager, "__aexit__")):
                        raise _BadFactory(
                            "connect() must return an async context manager that yields a ready"
                            f" ClientSession or Client, got {type(manager).__name__}"
                        )
                    hosted = _Hosted(self._generation + 1)
                    session: SessionLike = await tg.start(self._host, manager, hosted)
            if pending.scope.cancelled_caught:
                raise ReconnectFailed("the RetryingSession closed during reconnection")
        except Exception as exc:
            logger.debug("reconnection failed: %s", type(exc).__name__)
            pending.error = exc
        else:
            previous = self._hosted.pop(self._generation, None)
            if previous is not None:
                previous.release.set()
            self._hosted[hosted.generation] = hosted
            self._session = session
            self._generation = hosted.generation
            self._dead = False
            self.connects += 1
            telemetry.reconnected()
            logger.debug("session generation %d is open", hosted.generation)
            if self._on_new_session is not None:
                self._on_new_session(session)
        finally:
            if self._pending is pending:
                self._pending = None
            pending.done.set()

    async def _host(
        self,
        manager: AbstractAsyncContextManager[SessionLike],
        hosted: _Hosted,
        *,
        task_status: anyio.abc.TaskStatus[SessionLike] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        started = False
        # This task sends the factory's requests, so the transport reports their failures here.
        watch = ConnectWatch()
        current_connect.set(watch)
        try:
            async with manager as session:
                started = True
                current_connect.set(None)
                task_status.started(session)
                await hosted.release.wait()
        except Exception as exc:
            if not started:
                # The transport failure itself, not the SDK's exception group around its
                # stand-in error (-32603) or around httpx2's exception.
                failure = watch.failure or transport_failure(exc)
                if failure is not None:
                    raise failure from failure.__cause__
                raise
            # The transport died under the session (its callers already got "Connection
            # closed"); the exception has nowhere better to go than the log.
            logger.debug(
                "session generation %d ended with %s", hosted.generation, type(exc).__name__
            )
        finally:
            hosted.closed = True
            if hosted.generation == self._generation:
                self._dead = True
