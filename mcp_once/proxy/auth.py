"""Who may call the proxy's `--listen` front: FastMCP's verifiers, set up from a token file or an
identity provider's JWKS.

A caller that gets in is a principal (rule 7: client id, issuer, subject), and the guard scopes
every record by it, so one caller's key never replays another's result. Two ways in, each one of
FastMCP's own providers (`build_proxy(..., auth=...)` takes any other `AuthProvider`):

- `token_file_auth(path)`: static bearer tokens, one `principal token` pair a line, for a small
  team or a test (FastMCP's `StaticTokenVerifier`). The file is a secret: refused when others
  may read or write it (as ssh refuses a private key), and no message or log line ever shows a
  token (a bad line is named by its number).
- `jwt_auth(jwks_url, issuer=..., audience=..., public_url=...)`: an OAuth resource server, as
  MCP's authorization spec makes an HTTP server: tokens from your identity provider, checked
  against its JWKS, issuer and audience (FastMCP's `JWTVerifier`), with the protected-resource
  metadata (RFC 9728) that tells a client where to get one (FastMCP's `RemoteAuthProvider`).

A missing or bad token is answered 401 with `WWW-Authenticate` before the request reaches the
server: nothing is parsed as MCP, claimed or stored.

FastMCP's verifiers (and the JOSE library under them) are imported when a front is given one,
not with this package: a stdio proxy, or a front without authentication, never needs them, and
they are start-up time before the first `tools/list` (issue 46).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from fastmcp.server.auth import AuthProvider, RemoteAuthProvider
from pydantic import AnyHttpUrl, ValidationError
from starlette.routing import Route

from idempotency import principal_digest

if TYPE_CHECKING:
    from fastmcp.server.auth.providers.jwt import StaticTokenVerifier

#: The shortest token a token file may hold: a guessable token is no authentication.
MIN_TOKEN_CHARS = 16
#: Where RFC 9728 puts protected-resource metadata (then the resource's path).
METADATA_PATH = "/.well-known/oauth-protected-resource"


class AuthConfigError(ValueError):
    """The front's authentication cannot be set up as given (a token file others may read, a bad
    line, an issuer that is not a URL): said without a token in it."""


def read_token_file(path: str | Path) -> dict[str, str]:
    """`path`'s tokens: each token and the principal it stands for. Lines are `principal token`;
    blank lines and lines starting with `#` are skipped. A principal may have several tokens (to
    rotate one); a token may stand for one principal only."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise AuthConfigError(f"cannot read the token file {path}: {exc.strerror}") from None
    if os.name != "nt" and stat.S_IMODE(mode) & 0o077:
        raise AuthConfigError(
            f"the token file {path} is open to others (mode {stat.S_IMODE(mode):04o}): it holds"
            f" secrets; make it readable by its owner only: chmod 600 {path}"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthConfigError(f"cannot read the token file {path}: {exc}") from None
    tokens: dict[str, str] = {}
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        where = f"{path}, line {number}"
        if len(words) != 2:
            raise AuthConfigError(f"{where}: expected `principal token` ({len(words)} words)")
        principal, token = words
        if len(token) < MIN_TOKEN_CHARS or not token.isascii() or not token.isprintable():
            raise AuthConfigError(
                f"{where}: the token of {principal!r} must be at least {MIN_TOKEN_CHARS}"
                " printable ASCII characters (make one with `openssl rand -hex 32`)"
            )
        if token in tokens:
            raise AuthConfigError(
                f"{where}: the same token as line {lines[token]}: a token stands for one principal"
            )
        tokens[token], lines[token] = principal, number
    if not tokens:
        raise AuthConfigError(f"the token file {path} holds no `principal token` line")
    return tokens


def token_file_auth(path: str | Path) -> StaticTokenVerifier:
    """Bearer tokens from a token file (`read_token_file`): the principal is the line's name
    (its client id and subject)."""
    from fastmcp.server.auth.providers.jwt import StaticTokenVerifier

    found = read_token_file(path)
    return StaticTokenVerifier(
        {token: {"client_id": who, "sub": who, "scopes": []} for token, who in found.items()}
    )


async def token_principals(auth: AuthProvider | None) -> dict[str, str]:
    """A token verifier's principals, each with the digest records' histories name it by
    (`idempotency.principal_digest`), as the verifier itself makes its access tokens; empty for
    any other provider, whose principals are not known in advance."""
    if auth is None:
        return {}
    from fastmcp.server.auth.providers.jwt import StaticTokenVerifier

    if not isinstance(auth, StaticTokenVerifier):
        return {}
    digests: dict[str, str] = {}
    for token in auth.tokens:
        access = await auth.verify_token(token)
        if access is not None:
            digests[access.client_id] = principal_digest(access)
    return digests


class ResourceServer(RemoteAuthProvider):
    """FastMCP's resource server, its metadata served at the RFC 9728 path of the MCP endpoint
    (`/.well-known/oauth-protected-resource/mcp`) and at the bare path too, where clients that
    predate path-aware discovery look."""

    def get_routes(self, mcp_path: str | None = None) -> list[Route]:
        routes = super().get_routes(mcp_path)
        bare = [
            Route(METADATA_PATH, endpoint=route.endpoint, methods=route.methods)
            for route in routes
            if route.path.startswith(METADATA_PATH + "/")
        ]
        return [*routes, *bare[:1]]


def jwt_auth(jwks_url: str, *, issuer: str, audience: str, public_url: str) -> ResourceServer:
    """An OAuth resource server for tokens `issuer` signs with a key of `jwks_url`, for
    `audience`; `public_url`: the proxy as its clients reach it (`https://mcp.example.com`),
    which its metadata names as the resource (with `/mcp`)."""
    for what, url in (("JWKS URL", jwks_url), ("issuer", issuer), ("public URL", public_url)):
        try:
            AnyHttpUrl(url)
        except ValidationError:
            raise AuthConfigError(f"the {what} must be an http(s) URL, not {url!r}") from None
    from fastmcp.server.auth.providers.jwt import JWTVerifier

    verifier = JWTVerifier(jwks_uri=jwks_url, issuer=issuer, audience=audience)
    return ResourceServer(verifier, [AnyHttpUrl(issuer)], base_url=public_url)
