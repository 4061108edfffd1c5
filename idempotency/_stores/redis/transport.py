"""Moving a `Wire`'s bytes: on asyncio the socket itself or an asyncio protocol, an anyio byte
stream elsewhere (trio).

Why these: on asyncio the cheapest path is the loop's own callbacks. A plain (no TLS) socket is
read and written directly (`SocketWire`: `add_reader` wakes it, `send` writes, and what the
kernel does not take waits for `add_writer`); over TLS, asyncio's protocol callbacks
(`AsyncioWire`). Either way bytes arriving are parsed and handed to the waiting futures in the
loop's callback, with no reader task and no stream object in between, and writing never
blocks. Trio has no callbacks, so there a reader
system task receives from an anyio byte stream, and the caller that finds no write in progress
writes for everyone.

On asyncio a command sent while nothing is in flight, by the one caller the last reply woke,
goes out at once: a caller alone pays no extra loop turn. Any other command waits for the end of
the current loop turn (`call_soon`), so that every command issued in that turn leaves in one
write; when one batch of replies woke many callers, their next commands leave together too.
Under trio the caller that finds no write in progress yields once and then writes everything
queued meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import ssl
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Final, cast

import anyio
import anyio.abc
import anyio.lowlevel

from ... import _system_task
from .wire import DEADLINE, NO_DEADLINE, ConnectionLost, Replies, Unreachable, Wire, Wiring


class AsyncioWire(Wire, asyncio.Protocol):
    """A `Wire` driven by asyncio's protocol callbacks."""

    def __init__(self, loop: asyncio.AbstractEventLoop, wiring: Wiring) -> None:
        super().__init__(wiring)
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        #: Chunks waiting for the end of the loop turn; non-empty exactly while a flush is due.
        self._buffer: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.feed(data)

    def eof_received(self) -> bool | None:
        return None  # close: Redis never half-closes a healthy connection

    def connection_lost(self, exc: Exception | None) -> None:
        reason = "closed by the server" if exc is None else str(exc) or repr(exc)
        self.die(ConnectionLost(f"the connection to Redis was {reason}", written=True))

    # -- Wire --------------------------------------------------------------------------------

    def request(self, chunk: bytes, count: int = 1) -> Awaitable[Replies]:
        if self.dead is not None:
            raise ConnectionLost(f"the connection to Redis is gone: {self.dead}", written=False)
        future: asyncio.Future[Replies] = self._loop.create_future()
        self._send(chunk, count, future)
        return future

    async def post(self, chunk: bytes, count: int = 1) -> None:
        if self.dead is None:
            self._send(chunk, count, None)

    def _send(self, chunk: bytes, count: int, waiter: asyncio.Future[Replies] | None) -> None:
        idle = not self._queue
        deadline = self._enqueue(count, waiter, self._loop.time())
        if self._timer is None and self._timeout is not None:
            # The head's deadline: this request's when it is alone.
            self._timer = self._loop.call_at(
                deadline if idle else self._queue[0][DEADLINE], self._watch
            )
        if self._buffer:
            self._buffer.append(chunk)
        elif idle and self._answered <= 1:
            self._mark_written()
            self._write(chunk)
        else:
            self._buffer.append(chunk)
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        if self.dead is not None or not self._buffer:
            return
        data = b"".join(self._buffer)
        self._buffer.clear()
        self._mark_written()
        self._write(data)

    def _write(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)

    def _watch(self) -> None:
        self._timer = None
        again = self._check_deadline(self._loop.time())
        if again != NO_DEADLINE:
            self._timer = self._loop.call_at(again, self._watch)

    def _resolve(self, waiter: asyncio.Future[Replies], value: Replies) -> None:
        if not waiter.done():  # a cancelled caller abandoned it
            waiter.set_result(value)

    def _fail(self, waiter: asyncio.Future[Replies], error: BaseException) -> None:
        if not waiter.done():
            waiter.set_exception(error)

    def _abort(self) -> None:
        self._buffer.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._transport.abort()


#: Bytes one read may take from a socket read directly (`SocketWire`).
READ_BYTES: Final = 64 * 1024


class SocketWire(AsyncioWire):
    """An `AsyncioWire` on a plain (no TLS) socket it reads and writes itself, woken by the
    loop's `add_reader`, with no asyncio transport in between.

    Why: at one caller a pair is two round trips plus the Python run between them, and the
    transport's layers (its write checks, its read callback allocating a 256 KiB buffer for
    each reply, the protocol calls) are a measurable share of that Python (~6-10 µs per pair
    here). TLS keeps the transport (asyncio's SSL layer), and so does a loop without
    `add_reader` (Windows' proactor).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, wiring: Wiring, sock: socket.socket):
        super().__init__(loop, wiring)
        self._sock = sock
        self._fd = sock.fileno()
        #: What the kernel did not take yet; written when the socket is writable again.
        self._unsent = b""
        loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        try:
            data = self._sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.connection_lost(exc)
            return
        if data:
            self.feed(data)
        else:
            self.connection_lost(None)

    def _write(self, data: bytes) -> None:
        if self._unsent:
            self._unsent += data
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self.connection_lost(exc)
            return
        if sent < len(data):
            self._unsent = data[sent:]
            self._loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        try:
            sent = self._sock.send(self._unsent)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.connection_lost(exc)
            return
        self._unsent = self._unsent[sent:]
        if not self._unsent:
            self._loop.remove_writer(self._fd)

    def _abort(self) -> None:
        super()._abort()
        try:
            # A closed loop refuses these (uvloop) or ignores them (asyncio); the socket goes.
            with contextlib.suppress(RuntimeError):
                self._loop.remove_reader(self._fd)
                if self._unsent:
                    self._loop.remove_writer(self._fd)
        finally:
            self._unsent = b""
            self._sock.close()


class _Slot:
    """Where one request's replies are delivered on a loop without futures."""

    __slots__ = ("error", "event", "value")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.value: Replies = None
        self.error: BaseException | None = None

    async def get(self) -> Replies:
        await self.event.wait()
        if self.error is not None:
            raise self.error
        return self.value


class StreamWire(Wire):
    """A `Wire` over an anyio byte stream, read by a system task (trio, or any anyio loop)."""

    def __init__(self, stream: anyio.abc.ByteStream, wiring: Wiring) -> None:
        super().__init__(wiring)
        self._stream = stream
        self._buffer: list[bytes] = []
        self._flushing = False
        self._wait_scope: anyio.CancelScope | None = None
        self._reader_scope = anyio.CancelScope()

    def request(self, chunk: bytes, count: int = 1) -> Awaitable[Replies]:
        return self._request(chunk, count)

    async def _request(self, chunk: bytes, count: int) -> Replies:
        if self.dead is not None:
            raise ConnectionLost(f"the connection to Redis is gone: {self.dead}", written=False)
        slot = _Slot()
        self._send(chunk, count, slot)
        if not self._flushing:
            await self._flush()
        return await slot.get()

    async def post(self, chunk: bytes, count: int = 1) -> None:
        if self.dead is None:
            self._send(chunk, count, None)
            if not self._flushing:
                await self._flush()

    def _send(self, chunk: bytes, count: int, waiter: _Slot | None) -> None:
        idle = not self._queue
        deadline = self._enqueue(count, waiter, anyio.current_time())
        self._buffer.append(chunk)
        if idle and self._wait_scope is not None:
            self._wait_scope.deadline = deadline

    async def _flush(self) -> None:
        """Write everything pending, as one write per round; shielded, so that a cancelled
        caller can never leave half a command on the connection."""
        self._flushing = True
        try:
            with anyio.CancelScope(shield=True):
                await anyio.lowlevel.checkpoint()  # the rest of this loop turn joins the write
                while self._buffer and self.dead is None:
                    data = b"".join(self._buffer)
                    self._buffer.clear()
                    self._mark_written()
                    await self._stream.send(data)
        except Exception as exc:  # any failure to write ends the connection
            self.die(ConnectionLost(f"writing to Redis failed: {exc!r}", written=True))
        finally:
            self._flushing = False

    async def read_forever(self) -> None:
        """The connection's reader (a system task): replies in, deadlines checked, and the
        stream closed when the connection dies. Never raises: a system task must not."""
        try:
            with self._reader_scope:
                while self.dead is None:
                    deadline = self._queue[0][DEADLINE] if self._queue else NO_DEADLINE
                    data = b""
                    with anyio.CancelScope(deadline=deadline) as self._wait_scope:
                        data = await self._stream.receive()
                    self._wait_scope = None
                    if data:
                        self.feed(data)
                    else:
                        self._check_deadline(anyio.current_time())
        except anyio.EndOfStream:
            closed = "the connection to Redis was closed by the server"
            self.die(ConnectionLost(closed, written=True))
        except Exception as exc:
            self.die(ConnectionLost(f"reading from Redis failed: {exc!r}", written=True))
        finally:
            self._wait_scope = None
            if self.dead is None:  # the event loop is shutting down
                self.die(ConnectionLost("the event loop closed", written=True))
            with anyio.CancelScope(shield=True):
                await self._stream.aclose()

    def _resolve(self, waiter: _Slot, value: Replies) -> None:
        waiter.value = value
        waiter.event.set()

    def _fail(self, waiter: _Slot, error: BaseException) -> None:
        waiter.error = error
        waiter.event.set()

    def _abort(self) -> None:
        self._buffer.clear()
        self._reader_scope.cancel()


@dataclass(frozen=True, slots=True)
class Address:
    """Where to connect: a TCP host and port, or a unix socket `path`; TLS when `tls`."""

    host: str | None
    port: int
    path: str | None = None
    tls: ssl.SSLContext | None = None
    server_hostname: str | None = None
    #: TCP keepalive and its options (`socket.TCP_KEEPIDLE` and the like), so that a peer that
    #: vanished without closing is noticed while the connection is idle; None: off.
    keepalive: dict[int, int] | None = field(default_factory=dict)

    def __str__(self) -> str:
        return self.path if self.path is not None else f"{self.host}:{self.port}"


async def open_wire(address: Address, wiring: Wiring, *, connect_timeout: float | None) -> Wire:
    """Open one connection on the current event loop. Raises `Unreachable`."""
    limit = math.inf if connect_timeout is None else connect_timeout
    try:
        with anyio.fail_after(limit):
            loop = _system_task.current_loop()
            if isinstance(loop, asyncio.AbstractEventLoop):
                wire: Wire = await _open_asyncio(loop, address, wiring)
            else:
                wire = await _open_stream(address, wiring)
    except TimeoutError:
        raise Unreachable(f"connecting to Redis at {address} timed out after {limit} s") from None
    except OSError as exc:
        raise Unreachable(f"could not connect to Redis at {address}: {exc}") from exc
    wiring.traffic.connects += 1
    return wire


async def _open_asyncio(loop: asyncio.AbstractEventLoop, address: Address, wiring: Wiring) -> Wire:
    if address.tls is None and hasattr(loop, "add_reader"):
        sock = await _connect_socket(loop, address)
        try:
            _keep_alive(sock, address)
            return SocketWire(loop, wiring, sock)
        except NotImplementedError:  # a loop without add_reader: the transport path
            sock.close()
        except BaseException:
            sock.close()
            raise
    wire = AsyncioWire(loop, wiring)
    tls = address.tls
    hostname = address.server_hostname if tls else None
    if address.path is not None:
        transport, _ = await loop.create_unix_connection(
            lambda: wire, address.path, ssl=tls, server_hostname=hostname
        )
    else:
        assert address.host is not None
        transport, _ = await loop.create_connection(
            lambda: wire, address.host, address.port, ssl=tls, server_hostname=hostname
        )
    _keep_alive(transport.get_extra_info("socket"), address)
    return wire


async def _connect_socket(loop: asyncio.AbstractEventLoop, address: Address) -> socket.socket:
    """A connected non-blocking socket to `address` (each address the host resolves to, in
    turn). Raises `OSError`."""
    if address.path is not None:
        targets: list[tuple[int, int, int, Any]] = [
            (socket.AF_UNIX, socket.SOCK_STREAM, 0, address.path)
        ]
    else:
        found = await loop.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
        targets = [(family, kind, proto, where) for family, kind, proto, _, where in found]
    error: OSError = OSError(f"{address} resolves to no address")
    for family, kind, proto, where in targets:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, where)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise error


async def _open_stream(address: Address, wiring: Wiring) -> Wire:
    stream: anyio.abc.ByteStream
    tls = address.tls
    if address.path is not None:
        stream = await anyio.connect_unix(address.path)
        if tls is not None:
            from anyio.streams.tls import TLSStream

            stream = await TLSStream.wrap(
                stream,
                hostname=address.server_hostname,
                ssl_context=tls,
                standard_compatible=False,
            )
    else:
        assert address.host is not None
        if tls is None:
            stream = await anyio.connect_tcp(address.host, address.port)
        else:
            stream = await anyio.connect_tcp(
                address.host,
                address.port,
                ssl_context=tls,
                tls_hostname=address.server_hostname or address.host,
                tls_standard_compatible=False,
            )
    _keep_alive(stream.extra(anyio.abc.SocketAttribute.raw_socket, None), address)
    wire = StreamWire(stream, wiring)
    _system_task.spawn(wire.read_forever, name="mcp-once Redis reader")
    return wire


def _keep_alive(sock: Any, address: Address) -> None:
    if sock is None or address.path is not None or address.keepalive is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in address.keepalive.items():
        try:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
        except OSError:  # not every platform has every knob
            continue
