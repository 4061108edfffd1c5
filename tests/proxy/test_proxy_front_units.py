"""The `--listen` front's parts that need no process (fast tier): who may call (the token file, the
options' checks, the refusal of an open listener), what the upstream is sent (`--upstream-header`),
and the limits (`BodyLimit` driven as ASGI, `InFlightLimit` on an in-memory server).

The same behaviours through real HTTP and real processes: `test_proxy_auth.py`."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client, FastMCP
from mcp import MCPError

from idempotency import wire
from mcp_once._cli import main
from mcp_once._cli._front import is_loopback
from mcp_once._cli._upstream_headers import with_headers
from mcp_once._limits import DEFAULT_MAX_BODY
from mcp_once.proxy import Upstream, UpstreamConfigError
from mcp_once.proxy.auth import AuthConfigError, jwt_auth, read_token_file, token_file_auth
from mcp_once.proxy.limits import BodyLimit, InFlightLimit

ALICE = "alice-" + "a" * 32
BOB = "bob-" + "b" * 32


def token_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "tokens"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_token_file_maps_tokens_to_principals(tmp_path: Path) -> None:
    path = token_file(tmp_path, f"# the team\nalice {ALICE}\n\nbob {BOB}\nalice {ALICE}-next\n")
    assert read_token_file(path) == {ALICE: "alice", BOB: "bob", f"{ALICE}-next": "alice"}


@pytest.mark.anyio
async def test_a_token_files_principal_is_its_client_id_and_subject(tmp_path: Path) -> None:
    verifier = token_file_auth(token_file(tmp_path, f"alice {ALICE}\n"))
    access = await verifier.verify_token(ALICE)
    assert access is not None and (access.client_id, access.subject) == ("alice", "alice")
    assert await verifier.verify_token(BOB) is None


@pytest.mark.skipif(os.name == "nt", reason="POSIX modes")
@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o644])
def test_a_token_file_others_may_open_is_refused(tmp_path: Path, mode: int) -> None:
    path = token_file(tmp_path, f"alice {ALICE}\n", mode)
    with pytest.raises(AuthConfigError, match=f"open to others \\(mode 0{mode:o}\\)") as caught:
        read_token_file(path)
    assert f"chmod 600 {path}" in str(caught.value)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (f"alice {ALICE} extra\n", "line 1: expected `principal token` (3 words)"),
        (f"# c\nalice {ALICE}\nbob\n", "line 3: expected `principal token` (1 words)"),
        ("alice short-token\n", "line 1: the token of 'alice' must be at least 16"),
        (f"alice {ALICE}\nbob {ALICE}\n", "line 2: the same token as line 1"),
        ("# nobody yet\n\n", "holds no `principal token` line"),
    ],
)
def test_a_bad_token_file_is_refused_naming_the_line_never_a_token(
    tmp_path: Path, text: str, said: str
) -> None:
    with pytest.raises(AuthConfigError, match=re.escape(said)) as e:
        read_token_file(token_file(tmp_path, text))
    assert ALICE not in str(e.value) and "short-token" not in str(e.value)


def test_a_missing_token_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(AuthConfigError, match=r"cannot read the token file .*missing"):
        read_token_file(tmp_path / "missing")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("192.168.1.2", False),
        ("mcp.example.com", False),  # a name is not resolved
    ],
)
def test_only_loopback_addresses_need_no_authentication(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


UPSTREAM = ["--", "node", "server.js"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["--listen", "0.0.0.0:8090"],
            "--listen 0.0.0.0:8090 can be reached from other machines, and whoever reaches it"
            " calls the upstream with the proxy's credentials: give --auth-tokens FILE, or"
            " --auth-jwt JWKS_URL --auth-issuer ISS --auth-audience AUD; or --no-auth",
        ),
        (["--listen", "[::]:8090"], "--listen :::8090 can be reached from other machines"),
        (["--listen", "mcp.internal:8090"], "give --auth-tokens FILE, or --auth-jwt JWKS_URL"),
        (["--auth-tokens", "t"], "--auth-tokens is for the --listen front"),
        (["--no-auth"], "--no-auth is for the --listen front"),
        (
            ["--listen", "0.0.0.0:1", "--auth-tokens", "t", "--no-auth"],
            "--auth-tokens and --no-auth: give one of them",
        ),
        (
            ["--listen", "127.0.0.1:1", "--auth-tokens", "t", "--auth-jwt", "http://i/jwks"],
            "--auth-tokens and --auth-jwt: give one of them",
        ),
        (
            ["--listen", "127.0.0.1:1", "--auth-jwt", "http://i/jwks", "--auth-issuer", "http://i"],
            "--auth-jwt needs --auth-audience",
        ),
        (
            ["--listen", "127.0.0.1:1", "--auth-audience", "a"],
            "--auth-audience goes with --auth-jwt JWKS_URL",
        ),
        (
            [
                *("--listen", "0.0.0.0:1", "--auth-jwt", "http://i/j", "--auth-issuer", "http://i"),
                *("--auth-audience", "a"),
            ],
            "give --public-url URL",
        ),
        (["--listen", "127.0.0.1:1", "--max-body", "0"], "--max-body: must be at least 1"),
        (["--listen", "127.0.0.1:1", "--max-in-flight", "x"], "--max-in-flight: not a whole"),
    ],
)
def test_the_front_options_are_checked_before_anything_starts(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each refusal exits 2 before the upstream is named or started (`node server.js` is not
    run: it does not exist here)."""
    with pytest.raises(SystemExit) as caught:
        main(["proxy", *argv, *UPSTREAM])
    assert caught.value.code == 2
    assert said in capsys.readouterr().err


def test_a_token_file_others_may_read_stops_the_proxy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = token_file(tmp_path, f"alice {ALICE}\n", 0o644)
    with pytest.raises(SystemExit) as caught:
        main(["proxy", "--listen", "127.0.0.1:0", "--auth-tokens", str(path), *UPSTREAM])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "open to others" in err and ALICE not in err


def test_upstream_headers_come_from_the_environment_for_an_http_upstream_only() -> None:
    http = Upstream.http("https://mcp.example.com/mcp")
    environ = {"UPSTREAM_AUTH": "Bearer up-secret"}
    sent = with_headers(http, ["Authorization:UPSTREAM_AUTH"], environ)
    assert dict(sent.headers) == {"Authorization": "Bearer up-secret"}
    # Part of the upstream's identity, as a config entry's headers are (hashed, never shown).
    assert sent.identity != http.identity
    assert "up-secret" not in sent.described() and "Authorization" in sent.described()
    assert with_headers(http, [], {}) is http
    problems: list[tuple[Upstream, str, str]] = [
        (Upstream.stdio("node", "s.js"), "Authorization:UPSTREAM_AUTH", "for an HTTP upstream"),
        (http, "Authorization=UPSTREAM_AUTH", "takes NAME:ENV_VAR"),
        (http, "Authorization:Bearer up-secret", "takes NAME:ENV_VAR"),
        (http, "Authorization:UNSET_VARIABLE", "UNSET_VARIABLE is not set"),
        (sent, "authorization:UPSTREAM_AUTH", "the upstream has that header"),
    ]
    for upstream, option, said in problems:
        with pytest.raises(UpstreamConfigError, match=said) as caught:
            with_headers(upstream, [option], environ)
        assert "up-secret" not in str(caught.value)


# -- BodyLimit, driven as ASGI -------------------------------------------------------------------


class Downstream:
    """The app behind the limit: what it was handed, if it was called at all."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Callable[[], Any], send: Any) -> None:
        message = await receive()
        self.bodies.append(message["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def drive(limit: BodyLimit, chunks: list[bytes], *, length: int | None) -> tuple[int, int]:
    """Send `chunks` through `limit`: (the response status, how many chunks it read)."""
    headers = [] if length is None else [(b"content-length", str(length).encode())]
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers}
    pending = list(chunks)
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        read += 1
        chunk = pending.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    await limit(scope, receive, send)
    return sent[0]["status"], read


@pytest.mark.anyio
async def test_an_oversized_body_is_refused_413_before_anything_reads_it() -> None:
    app = Downstream()
    limit = BodyLimit(app, max_bytes=10)
    # Declared too long: refused unread.
    assert await drive(limit, [b"x" * 11], length=11) == (413, 0)
    # Chunked, no length: refused at the first chunk past the bound, the rest unread.
    assert await drive(limit, [b"x" * 6, b"x" * 6, b"x" * 6], length=None) == (413, 2)
    assert app.bodies == []
    # Within the bound, in chunks: handed on whole.
    assert await drive(limit, [b"12345", b"67890"], length=None) == (200, 2)
    assert app.bodies == [b"1234567890"]
    assert BodyLimit(app).max_bytes == DEFAULT_MAX_BODY


# -- InFlightLimit, on an in-memory server --------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # FastMCP's in-memory transport
async def test_a_caller_over_its_calls_in_flight_is_refused_32013_with_a_hint() -> None:
    server = FastMCP("held")
    started: list[str] = []
    both, release = anyio.Event(), anyio.Event()

    @server.tool
    async def hold(name: str) -> str:
        started.append(name)
        if len(started) == 2:
            both.set()
        await release.wait()
        return name

    limit = InFlightLimit(max_in_flight=2)
    server.add_middleware(limit)
    async with Client(server) as client, anyio.create_task_group() as tasks:
        for name in ("a", "b"):
            tasks.start_soon(client.call_tool, "hold", {"name": name})
        await both.wait()
        assert limit.in_flight() == 2  # both running (an unauthenticated caller: None)
        with pytest.raises(MCPError) as refused:
            await client.call_tool_mcp("hold", {"name": "c"})
        error = refused.value.error
        assert error.code == wire.STORE_UNAVAILABLE
        assert error.data == {"retryAfterMs": 500, "limit": "inFlight", "maxInFlight": 2}
        assert sorted(started) == ["a", "b"]  # the refused call never ran
        release.set()
    assert limit.in_flight() == 0
    async with Client(server) as client:
        assert (await client.call_tool("hold", {"name": "c"})).data == "c"


def test_a_jwt_resource_server_needs_urls() -> None:
    with pytest.raises(AuthConfigError, match="the issuer must be an http\\(s\\) URL, not 'acme'"):
        jwt_auth("https://id.example/jwks", issuer="acme", audience="a", public_url="http://x")
    server = jwt_auth(
        "https://id.example/jwks",
        issuer="https://id.example",
        audience="gateway",
        public_url="https://mcp.example.com",
    )
    paths = [route.path for route in server.get_routes("/mcp")]
    assert paths == [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ]
