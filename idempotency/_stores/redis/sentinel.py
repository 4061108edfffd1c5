"""Finding a Sentinel-managed primary: the `redis+sentinel://` URL, and discovery over the store's
own connections.

Why not redis-py's Sentinel client: it is asyncio-only, and the store runs under trio too. The
question is one command (`SENTINEL get-master-addr-by-name <service>`), so the store asks it
itself, over a short-lived connection of its own transport (`transport.open_wire`): the
Sentinels in the order given, the first that names a primary wins. redis-py still holds the
configuration: a `redis+sentinel://` URL becomes a `Sentinel(...).master_for(...)` client (so a
client built by hand is accepted the same way), and `Endpoint.of_pool` reads the Sentinels'
configuration back from that client's pool, never using its connections.

A Sentinel may name a primary that is no longer one (a failover in progress, a stale view): the
endpoint therefore asks every new connection for its `ROLE` in the handshake and refuses a node
that is not a master (`Endpoint.misplaced`), so writes never go to a replica. After a failover the
old connection dies (the primary was killed, or Sentinel's reconfiguration ran `CLIENT KILL` on a
demoted one, or a write met `READONLY` and the store dropped the link), and the next connect asks
the Sentinels again.

URL: `redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db][?options]`.
The user and password are the data nodes' (as in `redis://`); the Sentinels' own are the query
options `sentinel_username` and `sentinel_password`. Other query options are redis-py's
(`socket_timeout`, `client_name`, ...).

TLS: `rediss+sentinel://` is TLS to the data nodes AND to the Sentinels, with the same `ssl_*`
options (CA, client certificate, `ssl_cert_reqs`) for both. That is how Redis itself deploys it:
a Sentinel that reaches its nodes over TLS (`tls-replication yes`) is configured with the same
certificates and normally listens on TLS only (`port 0`, `tls-port`); one scheme per deployment
keeps a plaintext hop from hiding behind a URL that says `rediss`. Each connection verifies the
certificate against the host it dials: the Sentinel's as written in the URL, the primary's as
the Sentinel names it (usually an IP address, so the node certificates need that IP as a
subjectAltName). A deployment whose Sentinels differ (plaintext, another CA) passes
`sentinel_kwargs` to `from_url`: what it names replaces the TLS defaults for the Sentinels,
e.g. `sentinel_kwargs={"ssl": False}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Protocol
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from redis import exceptions as rx
from redis.asyncio import Redis
from redis.asyncio.connection import parse_url
from redis.asyncio.sentinel import Sentinel

from .transport import Address, open_wire
from .wire import ReplyError, Traffic, Unreachable, Wiring, command

SCHEME: Final = "redis+sentinel://"
TLS_SCHEME: Final = "rediss+sentinel://"
SENTINEL_SCHEMES: Final = (SCHEME, TLS_SCHEME)
DEFAULT_SENTINEL_PORT: Final = 26379
_SENTINEL_OPTIONS: Final = ("sentinel_username", "sentinel_password")


class SentinelEndpoint(Protocol):
    """What asking one Sentinel needs of it: where it listens, its timeouts, its handshake.

    An `endpoint.Endpoint` (read from the Sentinel's redis-py pool) is one. Named here rather
    than imported: an endpoint behind Sentinel holds its `Sentinels`, so `endpoint.py` imports
    this module, and this module must not import it back."""

    @property
    def address(self) -> Address: ...

    @property
    def timeout(self) -> float | None: ...

    @property
    def connect_timeout(self) -> float | None: ...

    async def handshake(self) -> list[bytes]: ...


@dataclass(slots=True)
class Sentinels:
    """The Sentinels watching one service, and how to ask them.

    Each Sentinel is an `Endpoint` read from its redis-py pool (`Endpoint.of_pool`, the one
    reader of redis-py's configuration: address, TLS, credentials, timeouts). The Sentinel
    that answered last is asked first next time (as redis-py does), so a dead or unreachable
    first Sentinel costs one failed attempt, not one per connect."""

    service: str
    endpoints: tuple[SentinelEndpoint, ...]
    #: Index in `endpoints` of the Sentinel that answered last.
    first: int = 0

    async def primary(self) -> tuple[str, int]:
        """The primary's host and port, as the first Sentinel that knows it says.

        Raises `Unreachable` (naming every Sentinel's failure) when none does."""
        failures: list[str] = []
        count = len(self.endpoints)
        for index in [(self.first + step) % count for step in range(count)]:
            endpoint = self.endpoints[index]
            try:
                found = await self._ask(endpoint)
            except rx.RedisError as exc:  # unreachable, refused, no reply in time
                failures.append(f"{endpoint.address}: {exc}")
                continue
            if found is not None:
                self.first = index
                return found
            failures.append(f"{endpoint.address}: knows no primary for {self.service!r}")
        raise Unreachable(
            f"no Sentinel named the primary of {self.service!r}: " + "; ".join(failures)
        )

    async def _ask(self, endpoint: SentinelEndpoint) -> tuple[str, int] | None:
        wiring = Wiring(endpoint.timeout, Traffic())
        wire = await open_wire(endpoint.address, wiring, connect_timeout=endpoint.connect_timeout)
        try:
            chunks = await endpoint.handshake()
            chunks.append(command(b"SENTINEL", b"GET-MASTER-ADDR-BY-NAME", self.service))
            replies = await wire.request(b"".join(chunks), len(chunks))
        finally:
            wire.close()
        answers = replies if len(chunks) > 1 else [replies]
        for answer in answers:
            if isinstance(answer, ReplyError):
                raise answer
        named = answers[-1]
        if not (isinstance(named, list) and len(named) == 2):
            return None
        return bytes(named[0]).decode(), int(named[1])


def sentinel_client(url: str, **redis_kwargs: Any) -> Redis:
    """A redis-py `master_for` client configured by a `redis+sentinel://` or `rediss+sentinel://`
    URL (never connected: the store only reads its configuration). `redis_kwargs` are redis-py
    connection options for the data nodes; `sentinel_kwargs` (a dict), if given, configures the
    Sentinels (with TLS: over the data nodes' `ssl_*` options, which it may replace)."""
    hosts, service, options, sentinel_options = parse_sentinel_url(url)
    sentinel_kwargs = dict(redis_kwargs.pop("sentinel_kwargs", None) or {})
    for name in ("socket_timeout", "socket_connect_timeout"):
        if name in redis_kwargs:
            sentinel_kwargs.setdefault(name, redis_kwargs[name])
    if url.startswith(TLS_SCHEME):
        for name, value in {**options, **redis_kwargs}.items():
            if name == "ssl" or name.startswith("ssl_"):
                sentinel_kwargs.setdefault(name, value)
    sentinel_kwargs.update(sentinel_options)
    manager = Sentinel(hosts, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    client: Redis = manager.master_for(service, **{**options, **redis_kwargs})
    return client


def parse_sentinel_url(
    url: str,
) -> tuple[list[tuple[str, int]], str, dict[str, Any], dict[str, Any]]:
    """(Sentinel hosts, service name, data-node options, Sentinel options) of a
    `redis+sentinel://` or `rediss+sentinel://` URL. Raises `ValueError` saying what is wrong."""
    if not url.startswith(SENTINEL_SCHEMES):
        raise ValueError(f"a Sentinel URL starts with {SCHEME} or {TLS_SCHEME}, not {url!r}")
    parts = urlsplit(url)
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    hosts = [_host_port(piece, url) for piece in hostlist.split(",") if piece.strip()]
    if not hosts:
        raise ValueError(f"no Sentinel host:port in {url!r}")
    path = [unquote(p) for p in parts.path.strip("/").split("/")] if parts.path.strip("/") else []
    if not path or not path[0]:
        raise ValueError(f"no service name in {url!r} (redis+sentinel://host:port/service_name)")
    if len(path) > 2:
        raise ValueError(f"too many path parts in {url!r}: expected /service_name[/db]")
    db = path[1] if len(path) == 2 else "0"
    if not (db.isascii() and db.isdigit()):
        raise ValueError(f"the database in {url!r} must be a number >= 0, not {db!r}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    sentinel_options = {
        name.removeprefix("sentinel_"): value for name, value in query if name in _SENTINEL_OPTIONS
    }
    rest = urlencode([(name, value) for name, value in query if name not in _SENTINEL_OPTIONS])
    at = f"{userinfo}@" if userinfo else ""
    # redis-py parses the rest exactly as it would a redis:// URL (credentials, db, options).
    options: dict[str, Any] = dict(parse_url(f"redis://{at}sentinel/{db}?{rest}"))
    options.pop("host", None)
    options.pop("port", None)
    if url.startswith(TLS_SCHEME):
        # redis-py's Sentinel pool picks its TLS connection class from this flag.
        options["ssl"] = True
    return hosts, path[0], options, sentinel_options


def _host_port(piece: str, url: str) -> tuple[str, int]:
    host, colon, port = piece.strip().rpartition(":")
    if not colon:
        host, port = piece.strip(), str(DEFAULT_SENTINEL_PORT)
    host = host.removeprefix("[").removesuffix("]")
    if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"bad Sentinel address {piece!r} in {url!r}: expected host:port")
    return host, int(port)


def master_role(reply: object) -> bool:
    """Whether a `ROLE` reply says the node is a primary."""
    return isinstance(reply, list) and bool(reply) and reply[0] == b"master"
