"""Who is calling: the identity a server-derived key is bound to (rule 7).

A key the *client* sends is its claim that two requests are one logical call, so it is honoured
for anyone in the key's scope. A key the *server* derives for a keyless call has no such claim
behind it: two different users can make the same call. A derived key's record is therefore
bound to the caller that produced it, in this order of preference:

1. the authenticated principal (client id, issuer, subject): the same user on any connection;
2. the legacy streamable-HTTP session id (`mcp-session-id`): minted by the server, unguessable,
   and already checked by the SDK to belong to the requestor;
3. the duplex connection itself (one stdio pipe, one in-memory stream connection, either era): a
   random id minted the first time mcp-once sees the connection and forgotten with it.

Anything else — stateless streamable HTTP (the 2026-07-28 single-exchange entry, or
`stateless_http=True`) and the SDK's modern in-process direct dispatch, without authentication —
has no caller identity: keyless calls there are not merged, and the listing says so.

And whether that caller is still there (rule 15): a re-send is merged only after its caller gave
up on the earlier answer. `cancel_requested` reads the caller's `notifications/cancelled`,
`disconnected` an HTTP client that left; `connection_of` names what request ids are unique in.

The SDK keeps the connection, and the request's dispatch context, on private attributes of its
per-request session (`ServerSession._connection`, `_request_outbound`), and the requests it
has read off a connection in its dispatcher (`_in_flight`); those reads live here.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Mapping
from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken, principal_components
from mcp.server.context import ServerRequestContext

from .._stores.history import scope_digest
from .fingerprint import canonical_json

#: One random id per duplex channel object, dropped when the channel is collected.
_channel_ids: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()


def _connection_of(request: ServerRequestContext[Any, Any]) -> Any:
    return getattr(request.session, "_connection", None)


def _channel_of(connection: Any) -> object | None:
    """The object that lives exactly as long as the client's connection, or None.

    A handshake connection (stdio, in-memory, legacy HTTP) and a 2026-07-28 duplex stream both
    keep one standalone outbound channel for their whole life, while a fresh `Connection` may be
    built per request. A single-exchange HTTP request has none; neither has the SDK's in-process
    direct dispatch (`Client(server)` in the modern era), whose per-client peer is not reachable
    from the request: such calls have no caller identity and are not merged.
    """
    if connection is not None and getattr(connection, "has_standalone_channel", False) is True:
        channel: object | None = getattr(connection, "outbound", None)
        return channel
    return None


def _channel_id(channel: object) -> str | None:
    try:
        found = _channel_ids.get(channel)
        if found is None:
            found = _channel_ids[channel] = uuid.uuid4().hex
        return found
    except TypeError:  # not weak-referenceable: no identity rather than a leaked one
        return None


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


def caller_of(request: ServerRequestContext[Any, Any] | None) -> str | None:
    """A stable text naming the caller of this request, or None when none exists."""
    principal = principal_of(request)
    if principal is not None:
        return f"principal:{principal}"
    return connection_of(request)


def connection_of(request: ServerRequestContext[Any, Any] | None) -> str | None:
    """A stable text naming the connection (legacy HTTP session, duplex channel) this request
    came over, or None: what request ids are unique within, whoever the caller is."""
    if request is None:
        return None
    connection = _connection_of(request)
    session_id = getattr(connection, "session_id", None)
    if isinstance(session_id, str) and session_id:
        return f"session:{session_id}"
    channel = _channel_of(connection)
    if channel is None:
        return None
    channel_id = _channel_id(channel)
    return None if channel_id is None else f"connection:{channel_id}"


def cancel_requested(request: ServerRequestContext[Any, Any] | None) -> bool:
    """Whether the caller sent `notifications/cancelled` for this request: it gave up, and the
    SDK will write no answer for it (rule 15: a re-send of it is no repeat).

    The SDK keeps the flag on the request's dispatch context, which its per-request session
    holds privately (`ServerSession._request_outbound`); the one read of it lives here. None of
    it there (another SDK build, a request built by hand) reads as not cancelled."""
    if request is None:
        return False
    dispatch = getattr(request.session, "_request_outbound", None)
    event = getattr(dispatch, "cancel_requested", None)
    is_set = getattr(event, "is_set", None)
    return bool(is_set()) if callable(is_set) else False


def in_flight_with(request: ServerRequestContext[Any, Any] | None) -> tuple[object, ...]:
    """The JSON-RPC ids of the other requests the SDK has received on `request`'s connection
    and not yet answered: each was sent before its caller could see anything this request is
    answered with now (rule 15: none of them reacts to that answer).

    The SDK keeps them in its dispatcher's table of requests in flight, entered as each request
    is read off the connection, before its handler runs (`JSONRPCDispatcher._in_flight`,
    reached from the request's dispatch context, which a 2026-07-28 duplex connection wraps);
    the one read of it lives here. A transport
    without one (a single-exchange HTTP request, another SDK build) reads as none."""
    if request is None:
        return ()
    dispatch = getattr(request.session, "_request_outbound", None)
    # A 2026-07-28 duplex connection wraps the dispatcher's context (`_inner`).
    dispatch = getattr(dispatch, "_inner", dispatch)
    table = getattr(getattr(dispatch, "_dispatcher", None), "_in_flight", None)
    if not isinstance(table, Mapping) or len(table) < 2:
        return ()
    return tuple(
        found
        for entry in tuple(table.values())
        if (other := getattr(entry, "dctx", None)) is not dispatch
        and (found := getattr(other, "request_id", None)) is not None
    )


async def disconnected(request: ServerRequestContext[Any, Any] | None) -> bool:
    """Whether the HTTP request this call came in has lost its client (rule 15: a give-up).

    On the 2025-era streamable HTTP transport a client that drops its POST's connection
    cancels nothing: the SDK ends that request's response stream and drops the answer when it
    comes. The request's ASGI channel still says so: Starlette's `is_disconnected` polls it
    without waiting (the server keeps answering `http.disconnect` once it happened, so asking
    takes nothing from the response that listens there too). Anything that is not an HTTP
    request, or cannot be asked, reads as connected."""
    http = getattr(request, "request", None) if request is not None else None
    ask = getattr(http, "is_disconnected", None)
    if not callable(ask):
        return False
    try:
        return bool(await ask())
    except Exception:
        return False
