"""`mcp-once proxy --listen`'s front: who may call it (`--auth-tokens`, `--auth-jwt`, `--no-auth`)
and its limits (`--max-body`, `--max-in-flight`).

Whoever reaches a listening proxy calls its upstream with the proxy's credentials, so a network
listener without authentication must be asked for: `--listen` on an address other than loopback
with no `--auth-*` option stops at once (exit 2, naming the options), before FastMCP is imported
or any upstream started; `--no-auth` says "on purpose" (another gateway authenticates in front of
it) and is warned about at start. Loopback needs no authentication: only this machine reaches it,
and the Host/Origin check keeps web pages out (DNS rebinding).

Checked here without FastMCP (`check`); the providers are FastMCP's, built once it is imported
(`auth_of`, from `mcp_once.proxy.auth`).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from dataclasses import dataclass
from typing import Any

from mcp_once._limits import DEFAULT_MAX_BODY, DEFAULT_MAX_IN_FLIGHT

from ._common import EXIT_USAGE, fail

logger = logging.getLogger("mcp_once.proxy")

#: The options that authenticate the front, as the refusal names them.
AUTH_OPTIONS = "--auth-tokens FILE, or --auth-jwt JWKS_URL --auth-issuer ISS --auth-audience AUD"


def _at_least_one(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def add_options(parser: argparse.ArgumentParser) -> None:
    front = parser.add_argument_group(
        "the --listen front: authentication (required off loopback) and limits"
    )
    front.add_argument(
        "--auth-tokens",
        metavar="FILE",
        help="static bearer tokens, one `principal token` pair a line (readable by its owner"
        " only: chmod 600)",
    )
    front.add_argument(
        "--auth-jwt",
        metavar="JWKS_URL",
        help="an OAuth resource server: JWTs signed with a key of this JWKS (with --auth-issuer"
        " and --auth-audience)",
    )
    front.add_argument("--auth-issuer", metavar="ISS", help="the JWTs' issuer (iss), a URL")
    front.add_argument("--auth-audience", metavar="AUD", help="the JWTs' audience (aud)")
    front.add_argument(
        "--public-url",
        metavar="URL",
        help="the proxy as its clients reach it (https://mcp.example.com), named in the"
        " protected-resource metadata of --auth-jwt (default: http://HOST:PORT of --listen)",
    )
    front.add_argument(
        "--no-auth",
        action="store_true",
        help="serve --listen off loopback without authentication, on purpose (a gateway in"
        " front authenticates)",
    )
    front.add_argument(
        "--max-body",
        type=_at_least_one,
        default=DEFAULT_MAX_BODY,
        metavar="BYTES",
        help="refuse a request body larger than this, 413, unread (default: %(default)s)",
    )
    front.add_argument(
        "--max-in-flight",
        type=_at_least_one,
        default=DEFAULT_MAX_IN_FLIGHT,
        metavar="N",
        help="calls one principal may have running at once; past it -32013 with retryAfterMs"
        " (default: %(default)s)",
    )


def is_loopback(host: str) -> bool:
    """Whether only this machine reaches `host`: `localhost` or a loopback address (a name is
    not resolved: what it resolves to may change under the proxy)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Front:
    """The checked front options."""

    host: str | None
    port: int | None
    tokens: str | None = None
    jwks: str | None = None
    issuer: str | None = None
    audience: str | None = None
    public_url: str | None = None
    no_auth: bool = False


def check(args: argparse.Namespace, listen: tuple[str, int] | None) -> Front:
    """The front `args` ask for, or exit 2 saying what is wrong: authentication without
    `--listen`, two ways at once, `--auth-jwt` without its issuer or audience, or a listener off
    loopback that authenticates nobody without `--no-auth`."""
    given = _given(
        ("--auth-tokens", args.auth_tokens),
        ("--auth-jwt", args.auth_jwt),
        ("--no-auth", args.no_auth),
    )
    jwt_only = _given(
        ("--auth-issuer", args.auth_issuer),
        ("--auth-audience", args.auth_audience),
        ("--public-url", args.public_url),
    )
    if listen is None:
        if given or jwt_only:
            fail(
                f"{(given + jwt_only)[0]} is for the --listen front: a stdio front is its"
                " client's own child, with nobody else to let in",
                EXIT_USAGE,
            )
        return Front(None, None)
    host, port = listen
    if len(given) > 1:
        fail(f"{' and '.join(given)}: give one of them", EXIT_USAGE)
    if args.auth_jwt is None and jwt_only:
        fail(f"{jwt_only[0]} goes with --auth-jwt JWKS_URL", EXIT_USAGE)
    if args.auth_jwt is not None:
        missing = [name for name in ("--auth-issuer", "--auth-audience") if name not in jwt_only]
        if missing:
            fail(
                f"--auth-jwt needs {' and '.join(missing)}: a token is accepted only from its"
                " issuer, and only for this server (its audience)",
                EXIT_USAGE,
            )
        if args.public_url is None and _unspecified(host):
            fail(
                f"--auth-jwt names the proxy's public URL in its metadata, and {host} is not"
                " one: give --public-url URL (as clients reach it, https://mcp.example.com)",
                EXIT_USAGE,
            )
    if not given and not is_loopback(host):
        fail(
            f"--listen {host}:{port} can be reached from other machines, and whoever reaches it"
            f" calls the upstream with the proxy's credentials: give {AUTH_OPTIONS}; or"
            " --no-auth to serve it unauthenticated on purpose (behind a gateway that"
            " authenticates)",
            EXIT_USAGE,
        )
    shown = f"[{host}]" if ":" in host else host
    return Front(
        host,
        port,
        tokens=args.auth_tokens,
        jwks=args.auth_jwt,
        issuer=args.auth_issuer,
        audience=args.auth_audience,
        public_url=args.public_url or (f"http://{shown}:{port}" if args.auth_jwt else None),
        no_auth=args.no_auth,
    )


def _given(*options: tuple[str, object]) -> list[str]:
    """The names of the (name, value) `options` that were given (not None, not False)."""
    return [name for name, value in options if value is not None and value is not False]


def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def auth_of(front: Front) -> Any:
    """FastMCP's provider for `front` (FastMCP imported by now); exit 2 when it cannot be set
    up (a token file others may read, a bad line, an issuer that is not a URL)."""
    from mcp_once.proxy.auth import AuthConfigError, jwt_auth, token_file_auth

    try:
        if front.tokens is not None:
            return token_file_auth(front.tokens)
        if front.jwks is not None:
            assert front.issuer and front.audience and front.public_url
            return jwt_auth(
                front.jwks,
                issuer=front.issuer,
                audience=front.audience,
                public_url=front.public_url,
            )
    except AuthConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    return None


async def announce(front: Front, auth: Any) -> None:
    """Say at start who the front lets in: the token file's principals by the digest
    `mcp-once keys` shows them by (never a token), or a warning for `--no-auth`."""
    from mcp_once.proxy.auth import token_principals

    if front.no_auth:
        logger.warning(
            "--no-auth: the front at %s:%s authenticates nobody: every caller shares one record"
            " scope and calls the upstream with the proxy's credentials; make sure a gateway in"
            " front of it authenticates",
            front.host,
            front.port,
        )
    digests = await token_principals(auth)
    if digests:
        named = ", ".join(f"{who} ({digest})" for who, digest in sorted(digests.items()))
        print(f"mcp-once proxy: principals of {front.tokens}: {named}", file=sys.stderr)
