"""Where the store's connections go and how they introduce themselves, read from redis-py.

redis-py stays the authority on configuration: its URL parsing (`redis://`, `rediss://`,
`unix://`, query options), its TLS context (certificates, verification, minimum version), its
credential providers, and a Sentinel client's list of Sentinels. A connection object built from
the pool's own `connection_class` and `connection_kwargs` (never connected) answers every
question; the store then opens its own multiplexed connections with those answers
(`link.py`).

Behind Sentinel the address is asked of the Sentinels on every connect (`sentinel.py`),
and the handshake ends with `ROLE`, so that a node that is not (or no longer) the primary is
refused before any command reaches it (`misplaced`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from redis import credentials
from redis.asyncio import connection as rconn

from .sentinel import Sentinels, master_role
from .transport import Address
from .wire import command


@dataclass(frozen=True, slots=True)
class Endpoint:
    #: Where the configuration points (Sentinel: see `sentinel`).
    address: Address
    db: int
    client_name: str | None
    credentials: credentials.CredentialProvider | None
    #: Seconds to wait for a reply (the redis-py option `socket_timeout`); None: forever.
    timeout: float | None
    connect_timeout: float | None
    #: Behind Sentinel: who is asked for the current primary on every connect.
    sentinel: Sentinels | None = None

    @classmethod
    def of_pool(cls, pool: rconn.ConnectionPool) -> Endpoint:
        conn: Any = pool.connection_class(**pool.connection_kwargs)
        provider = conn.credential_provider
        if provider is None and (conn.username or conn.password):
            provider = credentials.UsernamePasswordCredentialProvider(conn.username, conn.password)
        tls = conn.ssl_context.get() if isinstance(conn, rconn.SSLConnection) else None
        path = conn.path if isinstance(conn, rconn.UnixDomainSocketConnection) else None
        options = dict(getattr(conn, "socket_keepalive_options", {}) or {})
        keepalive = {int(k): int(v) for k, v in options.items()}
        host = getattr(conn, "host", None)
        return cls(
            address=Address(
                host=host,
                port=int(getattr(conn, "port", 6379)),
                path=path,
                tls=tls,
                server_hostname=host,
                keepalive=keepalive if getattr(conn, "socket_keepalive", True) else None,
            ),
            db=int(conn.db or 0),
            client_name=conn.client_name,
            credentials=provider,
            timeout=conn.socket_timeout,
            connect_timeout=conn.socket_connect_timeout,
            sentinel=_sentinels_of(pool, conn.socket_timeout, conn.socket_connect_timeout),
        )

    async def locate(self) -> Address:
        """Where to connect now (behind Sentinel: the primary it names at this moment)."""
        if self.sentinel is None:
            return self.address
        host, port = await self.sentinel.primary()
        return dataclasses.replace(self.address, host=host, port=port, server_hostname=host)

    async def handshake(self) -> list[bytes]:
        """The commands a fresh connection sends before any other (AUTH, SELECT, SETNAME; ROLE
        behind Sentinel, checked by `misplaced`)."""
        commands: list[bytes] = []
        if self.credentials is not None:
            commands.append(command(b"AUTH", *await self._credentials()))
        if self.db:
            commands.append(command(b"SELECT", self.db))
        if self.client_name:
            commands.append(command(b"CLIENT", b"SETNAME", self.client_name))
        if self.sentinel is not None:
            commands.append(command(b"ROLE"))
        return commands

    def misplaced(self, replies: list[object]) -> str | None:
        """Why a connection whose handshake got `replies` must not be used; None if it may.

        Behind Sentinel, a node that is not a master: a Sentinel's answer can be stale during
        a failover, and a write must never reach a replica."""
        if self.sentinel is None or (replies and master_role(replies[-1])):
            return None
        role = replies[-1] if replies else None
        seen = role[0] if isinstance(role, list) and role else role
        return f"the node Sentinel named for {self.sentinel.service!r} is not a master ({seen!r})"

    async def _credentials(self) -> tuple[str, ...]:
        provider = self.credentials
        assert provider is not None
        overridden = (
            type(provider).get_credentials_async
            is not credentials.CredentialProvider.get_credentials_async
        )
        try:
            asyncio.get_running_loop()
            on_asyncio = True
        except RuntimeError:
            on_asyncio = False
        if overridden and on_asyncio:
            return tuple(await provider.get_credentials_async())
        return tuple(provider.get_credentials())


def _sentinels_of(
    pool: Any, timeout: float | None, connect_timeout: float | None
) -> Sentinels | None:
    """The Sentinels of a redis-py `SentinelConnectionPool`, each read like any pool; None for
    any other pool.

    `timeout`/`connect_timeout` (the data nodes') apply where a Sentinel has none of its own:
    an unanswering Sentinel must not hold up every connect for ever."""
    manager = getattr(pool, "sentinel_manager", None)
    service = getattr(pool, "service_name", None)
    if manager is None or service is None:
        return None
    if not getattr(pool, "is_master", True):
        raise ValueError("the key store writes: give it master_for(...), not slave_for(...)")
    if not manager.sentinels:
        raise ValueError(f"no Sentinel given for service {service!r}")
    endpoints = []
    for client in manager.sentinels:
        endpoint = Endpoint.of_pool(client.connection_pool)
        endpoints.append(
            dataclasses.replace(
                endpoint,
                timeout=endpoint.timeout or timeout,
                connect_timeout=endpoint.connect_timeout or connect_timeout,
            )
        )
    return Sentinels(str(service), tuple(endpoints))
