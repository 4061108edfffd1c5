"""Who a key belongs to, and the hashed name a record is stored under (rule 7).

A client key is only unique for its client: two tenants may both send "order-1". The store key
is therefore a hash of (scope, tool, key), where the scope defaults to the authenticated principal
plus the server name. Keys are stored hashed: a store dump reveals neither keys nor tenants.
Who the authenticated principal of a request is, the SDK knows: `caller.principal_of` asks it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .fingerprint import canonical_json

if TYPE_CHECKING:  # the SDK only names a type here: naming a record needs no SDK (`keys`)
    from mcp.server.context import ServerRequestContext

#: Bumped if the derivation ever changes, so old and new records can never alias.
_STORE_KEY_VERSION = "mcp-once/1"


@dataclass(frozen=True, slots=True)
class CallScope:
    """What a scope function may look at. `request` is the SDK's request context (headers of an
    HTTP request live on `request.request`), `meta` the request `_meta`."""

    server: str
    tool: str
    #: Canonical text of the authenticated principal (client id, issuer, subject), or None.
    principal: str | None
    meta: Mapping[str, Any] | None
    request: ServerRequestContext[Any, Any] | None


#: Returns the partition a key lives in. The tool is always added by the guard.
ScopeFn = Callable[[CallScope], str]


def default_scope(call: CallScope) -> str:
    """Authenticated principal (when there is one) plus server name.

    Without authentication every client of the server shares one key space: keys must then be
    unguessable (the orchestrator mints UUIDs), and a derived key merges identical keyless calls.
    """
    return canonical_json({"server": call.server, "principal": call.principal}).decode()


def store_key(scope: str, tool: str, key: str) -> str:
    """The name a record is stored under: hex SHA-256 of (version, scope, tool, key).

    What `KeyStore.get` and `KeyStore.settle` take, `Record.key` holds and `mcp-once keys list`
    prints. The record of a key a client sent is `store_key(scope, tool, key)` with the scope
    the server's `Policy.scope` gave that call: by default `default_scope(CallScope(server,
    tool, principal, None, None))`, `principal` None without authentication.
    """
    return hashlib.sha256(canonical_json([_STORE_KEY_VERSION, scope, tool, key])).hexdigest()
