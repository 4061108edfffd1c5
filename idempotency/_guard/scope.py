"""Who a key belongs to, and the hashed name a record is stored under (rule 7).

A client key is only unique for its client: two tenants may both send "order-1". The store key
is therefore a hash of (scope, tool, key), where the scope defaults to the authenticated principal
plus the server name. Keys are stored hashed: a store dump reveals neither keys nor tenants.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken, principal_components
from mcp.server.context import ServerRequestContext

from .._stores.history import scope_digest
from .fingerprint import canonical_json

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


def _access_token(request: ServerRequestContext[Any, Any] | None) -> AccessToken | None:
    # The HTTP request carries the user the bearer middleware authenticated; the contextvar is the
    # SDK's fallback for code running in the request's own context.
    http_request = getattr(request, "request", None) if request is not None else None
    asgi_scope = getattr(http_request, "scope", None)
    if asgi_scope is not None and isinstance(asgi_scope, Mapping):  # no ABC check for None
        user = asgi_scope.get("user")
        if isinstance(user, AuthenticatedUser):
            return user.access_token
    return get_access_token()


def principal_of(request: ServerRequestContext[Any, Any] | None) -> str | None:
    """The authenticated principal of this request, as canonical text, or None."""
    token = _access_token(request)
    if token is None:
        return None
    return _principal_text(token)


def _principal_text(token: AccessToken) -> str:
    return canonical_json(list(principal_components(token))).decode()


def principal_digest(token: AccessToken) -> str:
    """The principal a token stands for (client id, issuer, subject) as records' histories name
    it on their claimed events (`principal`): a digest, the same on every server, never the
    principal or the token. What an operator matches `mcp-once keys list` against."""
    return scope_digest(_principal_text(token))


def store_key(scope: str, tool: str, key: str) -> str:
    """The name a record is stored under: hex SHA-256 of (version, scope, tool, key).

    What `KeyStore.get` and `KeyStore.settle` take, `Record.key` holds and `mcp-once keys list`
    prints. The record of a key a client sent is `store_key(scope, tool, key)` with the scope
    the server's `Policy.scope` gave that call: by default `default_scope(CallScope(server,
    tool, principal, None, None))`, `principal` None without authentication.
    """
    return hashlib.sha256(canonical_json([_STORE_KEY_VERSION, scope, tool, key])).hexdigest()
