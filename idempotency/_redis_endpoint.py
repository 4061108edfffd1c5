"""Where the store's connections go and how they introduce themselves, read from redis-py.

redis-py stays the authority on configuration: its URL parsing (`redis://`, `rediss://`,
`unix://`, query options), its TLS context (certificates, verification, minimum version), its
credential providers and Sentinel discovery. A connection object built from the pool's own
`connection_class` and `connection_kwargs` (never connected) answers every question; the store
then opens its own multiplexed connections with those answers (`_redis_link.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from redis import credentials
from redis.asyncio import connection as rconn

from ._redis_transport import Address
from ._redis_wire import command


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
    #: A Sentinel-managed pool: asked for the current primary on every connect (asyncio only).
    sentinel: Any = None

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
            sentinel=pool if hasattr(pool, "get_master_address") else None,
        )

    async def locate(self) -> Address:
        """Where to connect now (Sentinel: the primary it names at this moment)."""
        if self.sentinel is None:
            return self.address
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "a Sentinel-managed Redis is discovered through redis-py's asyncio client,"
                " so RedisKeyStore needs asyncio there"
            ) from None
        host, port = await self.sentinel.get_master_address()
        return dataclasses.replace(
            self.address, host=str(host), port=int(port), server_hostname=str(host)
        )

    async def handshake(self) -> list[bytes]:
        """The commands a fresh connection sends before any other (AUTH, SELECT, SETNAME)."""
        commands: list[bytes] = []
        if self.credentials is not None:
            commands.append(command(b"AUTH", *await self._credentials()))
        if self.db:
            commands.append(command(b"SELECT", self.db))
        if self.client_name:
            commands.append(command(b"CLIENT", b"SETNAME", self.client_name))
        return commands

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
