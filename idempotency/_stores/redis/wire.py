"""One Redis connection carrying many callers' commands at once: what is the same on every event
loop.

Why it exists: redis-py's asyncio client checks a connection out of a pool for every command,
writes it, reads its reply and checks the connection back in. That costs ~0.25–0.45 ms per script
call here and one connection per concurrent caller, and a pool that runs out fails at once. Redis
itself answers commands in the order it reads them, so one connection can carry every caller's
commands if each reply is handed to whoever sent the command it answers: the first reply to the
oldest request (FIFO). Commands issued together go out in one write (automatic pipelining), and
Redis reads and answers them as one batch.

`Wire` is that bookkeeping, free of I/O: requests in sending order, replies parsed by hiredis
(the parser redis-py uses too) and matched in order, and, when the connection dies, every
outstanding request failed at once with `ConnectionLost`, which says whether its bytes were
handed to the socket. A request that was never written can always be sent again; one that was
written may have run. The transports in `transport.py` move the bytes (an asyncio protocol,
or an anyio byte stream under trio).

A reply timeout kills the whole connection: once a reply is late, the order of the replies still
to come cannot be trusted. The caller whose reply was late gets `ReplyTimeout`; the others get
`ConnectionLost` and may try again on a new connection.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, cast

import hiredis
from redis import exceptions as rx

#: The replies to a request: one reply, or a list when the request holds several commands.
Replies = Any


class ReplyError(rx.ResponseError):
    """An error reply from Redis (`-NOSCRIPT ...`, `-READONLY ...`): the server answered, and the
    connection is fine. Delivered as a value, so one failed command of a pipeline does not hide
    the replies of the others."""

    @property
    def code(self) -> str:
        """The reply's first word, Redis's error code (`NOSCRIPT`, `BUSY`, `ERR`)."""
        text = str(self)
        return text.split(" ", 1)[0]


class ConnectionLost(rx.ConnectionError):
    """The connection died before this request's reply arrived.

    `written` is False when the request's bytes never left this process: sending it again cannot
    change any outcome. When True the command may have run, and only a command that is safe to
    re-send may be sent again.
    """

    def __init__(self, message: str, *, written: bool) -> None:
        super().__init__(message)
        self.written = written


class Unreachable(rx.ConnectionError):
    """No connection could be opened or set up (refused, timed out, authentication refused)."""


class ReplyTimeout(rx.TimeoutError):
    """No reply within the reply timeout; the command may have run. The connection is dropped."""


#: One command, given as a tuple of its words, in Redis's wire format (RESP), packed by
#: hiredis; the hot path calls it directly (`command` costs a frame and a tuple more).
pack: Final[Callable[[tuple[bytes | str | int | float, ...]], bytes]] = cast(
    Any,
    hiredis.pack_command,  # its stub types a 1-tuple
)


def command(*args: bytes | str | int | float) -> bytes:
    """One command in Redis's wire format (RESP), packed by hiredis."""
    return pack(args)


class Traffic:
    """What a store's connections did, for tests and benchmarks: one write is one round trip
    for a caller alone, however many commands it carries."""

    __slots__ = ("connects", "writes")

    def __init__(self) -> None:
        self.writes = 0
        self.connects = 0


#: One request waiting for its replies: (waiter, count, seq, deadline, replies). `waiter` is
#: the transport's (None: nobody waits), `count` how many commands it holds, `seq` its place
#: in sending order, `deadline` when its first reply is late, and `replies` collects the
#: replies of a request of several commands (None for one). A plain tuple, not an object: one
#: is made per command, and a tuple costs no call.
_Request = tuple[Any, int, int, float, list[Any] | None]
_WAITER: Final = 0
_SEQ: Final = 2
DEADLINE: Final = 3


#: A reply that is not an answer to a request (a pub/sub message); True when it was consumed.
PushHandler = Callable[[Any], bool]

NO_DEADLINE: Final = math.inf


@dataclass(frozen=True, slots=True)
class Wiring:
    """What a connection answers to: its reply timeout (None: none), the traffic counter, the
    handler of replies nobody asked for (pub/sub messages), and who hears that it died."""

    timeout: float | None
    traffic: Traffic
    push: PushHandler | None = None
    on_dead: Callable[[Wire], None] | None = None


class Wire:
    """The request/reply bookkeeping of one connection. Transports subclass it and supply
    `request`, `post` and the `_resolve`/`_fail`/`_abort` hooks."""

    def __init__(self, wiring: Wiring) -> None:
        #: Why the connection is gone; None while it is usable.
        self.dead: BaseException | None = None
        self._timeout = wiring.timeout
        self._traffic = wiring.traffic
        self._push = wiring.push
        self._on_dead = wiring.on_dead
        self._parser = hiredis.Reader(replyError=ReplyError)
        self._queue: collections.deque[_Request] = collections.deque()
        #: Sequence number of the last request enqueued, and of the last one written.
        self._seq = 0
        self._written = 0
        #: How many requests the last batch of bytes answered: more than one means several
        #: callers are about to send again in the same loop turn.
        self._answered = 0

    # -- for callers ---------------------------------------------------------------------------

    def request(self, chunk: bytes, count: int = 1) -> Awaitable[Replies]:
        """Send `chunk` (`count` commands) and await its replies."""
        raise NotImplementedError

    async def post(self, chunk: bytes, count: int = 1) -> None:
        """Send `chunk` without waiting for its replies (they are read and dropped)."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the connection; requests still waiting fail with `ConnectionLost`."""
        self.die(ConnectionLost("the key store closed its Redis connection", written=True))

    @property
    def outstanding(self) -> int:
        """Requests sent or queued whose replies have not all arrived."""
        return len(self._queue)

    # -- for transports ------------------------------------------------------------------------

    def _enqueue(self, count: int, waiter: Any, now: float) -> float:
        """Queue a request; returns its deadline."""
        self._seq += 1
        timeout = self._timeout
        deadline = NO_DEADLINE if timeout is None else now + timeout
        self._queue.append((waiter, count, self._seq, deadline, [] if count > 1 else None))
        return deadline

    def _mark_written(self) -> None:
        """Everything enqueued so far is being handed to the socket (it may now run)."""
        self._written = self._seq
        self._traffic.writes += 1

    def feed(self, data: bytes) -> None:
        """Parse what arrived and hand each reply to the request it answers."""
        parser = self._parser
        queue = self._queue
        push = self._push
        parser.feed(data)
        answered = 0
        while True:
            try:
                reply = parser.gets()
            except hiredis.ProtocolError as exc:
                self.die(ConnectionLost(f"Redis sent something unreadable: {exc}", written=True))
                return
            if reply is False:
                self._answered = answered
                return
            if push is not None and push(reply):
                continue
            if not queue:
                self.die(ConnectionLost("Redis sent a reply nobody asked for", written=True))
                return
            waiter, count, _, _, replies = queue[0]
            if replies is not None:
                replies.append(reply)
                if len(replies) < count:
                    continue
                reply = replies
            queue.popleft()
            answered += 1
            if waiter is not None:
                self._resolve(waiter, reply)

    def _check_deadline(self, now: float) -> float:
        """Kill the connection if the oldest request is late; else when to look again."""
        if self.dead is not None or not self._queue:
            return NO_DEADLINE
        head = self._queue[0]
        if head[DEADLINE] > now:
            return head[DEADLINE]
        late = ReplyTimeout(f"Redis did not answer within {self._timeout} s")
        self.die(late, late=head)
        return NO_DEADLINE

    def die(self, error: BaseException, *, late: _Request | None = None) -> None:
        """The connection is gone: fail every outstanding request, close, tell the owner."""
        if self.dead is not None:
            return
        self.dead = error
        queue, self._queue = self._queue, collections.deque()
        for request in queue:
            waiter = request[_WAITER]
            if waiter is None:
                continue
            if request is late:
                self._fail(waiter, error)
                continue
            written = request[_SEQ] <= self._written
            lost = ConnectionLost(f"the connection to Redis was lost: {error}", written=written)
            lost.__cause__ = error
            self._fail(waiter, lost)
        self._abort()
        if self._on_dead is not None:
            self._on_dead(self)

    def _resolve(self, waiter: Any, value: Replies) -> None:
        raise NotImplementedError

    def _fail(self, waiter: Any, error: BaseException) -> None:
        raise NotImplementedError

    def _abort(self) -> None:
        raise NotImplementedError
