"""The gateway lets in only who belongs (issue 47), as real processes over real HTTP:
`mcp-once proxy --listen` with `--auth-tokens` and `--auth-jwt`, in front of an upstream with an
effect ledger (`gated_server.py`).

- No token, or a bad one: 401 with `WWW-Authenticate`, nothing run, nothing stored.
- Records per principal: alice's key K runs; bob's K runs bob's own call (two effects); alice's K
  again replays alice's. `keys list` names each record's principal by the digest the proxy printed
  at start; the history's claimed event carries it. No token in a log line, a store byte or a
  history.
- `--auth-jwt` against a JWKS served here (keys made here): a valid token works; expired, wrong
  audience, wrong issuer, another key's signature: 401; the protected-resource metadata (RFC 9728)
  names the resource and its issuer.
- Behind nginx (the deployed location block), two replicas on one Redis authenticate each caller.
- No token passthrough: an HTTP upstream logging what it receives never sees the caller's
  `Authorization`, cookies or other headers, only the proxy's `--upstream-header`.
- An open listener is refused: `--listen 0.0.0.0:PORT` without `--auth-*` exits 2 before it binds
  or starts anything, naming the options; `--no-auth` is warned about.
- Limits: a body over `--max-body` is 413, unread (with or without a length); a principal past
  `--max-in-flight` gets -32013 with `retryAfterMs` while another principal's calls run.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.server.auth.providers.jwt import RSAKeyPair
from joserfc import jwk
from mcp import MCPError
from proxy_kit import lines, meta_key, proxy_command, status, text

from idempotency import open_store, parse_history, wire
from mcp_once.scenarios._process import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]

GATED = Path(__file__).parent / "gated_server.py"
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def gated(ledger: Path, *http: str) -> list[str]:
    return [sys.executable, str(GATED), str(ledger), *http]


def token_file(tmp_path: Path, **tokens: str) -> Path:
    path = tmp_path / "tokens"
    path.write_text("".join(f"{who} {token}\n" for who, token in tokens.items()))
    path.chmod(0o600)
    return path


@contextmanager
def proxy_at(
    args: list[str], log: Path, *, port: int = 0, env: dict[str, str] | None = None
) -> Iterator[str]:
    """`mcp-once proxy --listen 127.0.0.1:PORT ARGS...` until the block ends, its stderr in `log`:
    its URL, once it listens."""
    command = proxy_command("--listen", f"127.0.0.1:{port}", *args)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env={**os.environ, **(env or {})},
        )
    try:
        deadline = time.monotonic() + 90
        while (found := re.search(r"mcp-once proxy at (\S+)", log.read_text())) is None:
            if process.poll() is not None:
                raise RuntimeError(f"the proxy exited {process.returncode}: {log.read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the proxy did not listen: {log.read_text()}")
            time.sleep(0.05)  # a startup poll of the log, not synchronisation of the code tested
        yield found.group(1)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@asynccontextmanager
async def client(
    url: str, token: str | None, mode: str = "auto", **headers: str
) -> AsyncIterator[Client[Any]]:
    """A FastMCP client of `url`, `token` its bearer; `mode` "legacy" for a 2025-era caller."""
    sent = dict(headers)
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    transport = StreamableHttpTransport(url, headers=sent)
    async with Client(transport, mode=mode) as connected:
        yield connected


def raw_call(url: str, token: str | None, key: str) -> httpx.Response:
    """A `tools/call` POSTed as it is, with `token` as the bearer (or none)."""
    headers = dict(ACCEPT)
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "write", "arguments": {"text": key}, "_meta": meta_key(key)},
    }
    return httpx.post(url, json=call, headers=headers, timeout=30)


async def hold(caller: Client[Any], name: str) -> None:
    """`hold(name)` under key `name`: in flight until the upstream's `release`."""
    await caller.call_tool_mcp("hold", {"name": name}, meta=meta_key(name))


def refused_401(response: httpx.Response) -> bool:
    return response.status_code == 401 and response.headers["www-authenticate"].startswith("Bearer")


def principals_announced(log: Path) -> dict[str, str]:
    """The principals and digests the proxy printed at start."""
    line = re.search(r"principals of \S+: (.*)", log.read_text())
    assert line is not None, log.read_text()
    return dict(re.findall(r"(\S+) \(([0-9a-f]{16})\)", line.group(1)))


def kept_bytes(log: Path, folder: Path, pattern: str) -> list[bytes]:
    """`log`'s bytes and those of every file of `folder` matching `pattern`."""
    return [log.read_bytes(), *(path.read_bytes() for path in folder.glob(pattern))]


def wait_for_lines(path: Path, count: int) -> None:
    """Until `path` has `count` lines (written by another process), 60 s at most."""
    deadline = time.monotonic() + 60
    while lines(path) < count:
        assert time.monotonic() < deadline, f"{path} has {lines(path)} lines, not {count}"
        time.sleep(0.05)


@contextmanager
def gated_http(ledger: Path, received: Path) -> Iterator[str]:
    """`gated_server.py` over HTTP, logging the headers it receives to `received`: its URL."""
    upstream = subprocess.Popen(
        gated(ledger, "--headers", str(received)), stdout=subprocess.PIPE, text=True
    )
    try:
        assert upstream.stdout is not None
        yield upstream.stdout.readline().split()[-1]
    finally:
        upstream.send_signal(signal.SIGTERM)
        upstream.wait(timeout=30)


@dataclass(frozen=True)
class Exited:
    code: int
    stderr: str
    #: Seconds from start to exit: on the wall clock, and of CPU (the process and its children).
    wall: float
    cpu: float


def run_to_exit(argv: list[str]) -> Exited:
    begun = time.monotonic()
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert process.stderr is not None
    stderr = process.stderr.read().decode()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    cpu = usage.ru_utime + usage.ru_stime
    return Exited(process.returncode, stderr, time.monotonic() - begun, cpu)


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcp_once", *argv], capture_output=True, text=True, timeout=120
    )


async def test_each_principal_gets_its_own_records_and_no_token_is_kept(tmp_path: Path) -> None:
    alice, bob = secrets.token_hex(24), secrets.token_hex(24)
    tokens = token_file(tmp_path, alice=alice, bob=bob)
    ledger = tmp_path / "ledger"
    store_file = tmp_path / "keys.sqlite3"
    store = f"sqlite:///{store_file}"
    log = tmp_path / "proxy.log"
    args = ["--auth-tokens", str(tokens), "--store", store, "--", *gated(ledger)]
    with proxy_at(args, log) as url:
        # No token, a token nobody has, a token of the wrong shape: 401, nothing run or stored.
        assert refused_401(raw_call(url, None, "K"))
        assert refused_401(raw_call(url, secrets.token_hex(24), "K"))
        assert 'error="invalid_token"' in raw_call(url, "x", "K").headers["www-authenticate"]
        assert lines(ledger) == 0

        async with client(url, alice) as as_alice:
            first = await as_alice.call_tool_mcp("write", {"text": "K"}, meta=meta_key("K"))
        async with client(url, bob) as as_bob:
            bobs = await as_bob.call_tool_mcp("write", {"text": "K"}, meta=meta_key("K"))
        async with client(url, alice) as as_alice:
            again = await as_alice.call_tool_mcp("write", {"text": "K"}, meta=meta_key("K"))
        assert (status(first), status(bobs), status(again)) == ("executed", "executed", "replayed")
        assert text(again) == text(first)
        assert lines(ledger) == 2  # alice's call and bob's, once each

    digests = principals_announced(log)
    assert set(digests) == {"alice", "bob"} and len(set(digests.values())) == 2
    listed = run_cli("keys", "list", "--json", "--store", store)
    assert listed.returncode == 0, listed.stderr
    records = json.loads(listed.stdout)
    assert sorted(r["principal"] for r in records) == sorted(digests.values())
    table = run_cli("keys", "list", "--store", store).stdout.splitlines()
    assert table[0].split()[-1] == "principal"
    assert {row.split()[-1] for row in table[1:-1]} == set(digests.values())

    opened = open_store(store)
    try:
        histories = dict(await opened.histories())  # type: ignore[attr-defined]
    finally:
        await opened.aclose()
    claimed = [
        event.details["principal"]
        for history in histories.values()
        for event in parse_history(history)
        if event.kind == "claimed"
    ]
    assert sorted(claimed) == sorted(digests.values())

    # No token anywhere: the proxy's log, the store's bytes (and its WAL), the histories.
    kept = kept_bytes(log, tmp_path, "keys.sqlite3*")
    kept.append("".join(histories.values()).encode())
    for token in (alice, bob):
        assert not any(token.encode() in blob for blob in kept)


class Jwks:
    """A JWKS served on 127.0.0.1, with a key made here; tokens signed with it."""

    def __init__(self) -> None:
        self.pair = RSAKeyPair.generate()
        public = jwk.import_key(self.pair.public_key, "RSA").as_dict()
        body = json.dumps({"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]})

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Jwks:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def token(self, pair: RSAKeyPair | None = None, **claims: Any) -> str:
        return (pair or self.pair).create_token(kid="k1", **claims)


ISSUER = "https://id.example.com"
AUDIENCE = "mcp-once-gateway"


async def test_a_jwt_resource_server_takes_only_valid_tokens_of_its_issuer_and_audience(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    port = free_port()
    with Jwks() as jwks:
        args = ["--auth-jwt", jwks.url, "--auth-issuer", ISSUER, "--auth-audience", AUDIENCE]
        args += ["--store", f"sqlite:///{tmp_path / 'keys.sqlite3'}", "--", *gated(ledger)]
        with proxy_at(args, tmp_path / "proxy.log", port=port) as url:
            valid = jwks.token(subject="carol", issuer=ISSUER, audience=AUDIENCE)
            async with client(url, valid) as as_carol:
                result = await as_carol.call_tool_mcp("write", {"text": "j"}, meta=meta_key("j"))
            assert status(result) == "executed"

            bad = {
                "expired": jwks.token(
                    subject="carol", issuer=ISSUER, audience=AUDIENCE, expires_in_seconds=-60
                ),
                "audience": jwks.token(subject="carol", issuer=ISSUER, audience="another-api"),
                "issuer": jwks.token(
                    subject="carol", issuer="https://evil.example", audience=AUDIENCE
                ),
                "key": jwks.token(
                    RSAKeyPair.generate(), subject="carol", issuer=ISSUER, audience=AUDIENCE
                ),
            }
            for why, token in bad.items():
                response = raw_call(url, token, f"bad-{why}")
                assert refused_401(response), (why, response.status_code)
                # The challenge points at the metadata (RFC 9728), which names who issues tokens.
                challenge = response.headers["www-authenticate"]
                assert "resource_metadata=" in challenge, challenge
            assert lines(ledger) == 1

            base = f"http://127.0.0.1:{port}"
            for path in (
                "/.well-known/oauth-protected-resource/mcp",
                "/.well-known/oauth-protected-resource",
            ):
                metadata = httpx.get(base + path, timeout=30)
                assert metadata.status_code == 200, path
                described = metadata.json()
                assert described["resource"] == f"{base}/mcp"
                assert [s.rstrip("/") for s in described["authorization_servers"]] == [ISSUER]
    # The refusals are logged (FastMCP's verifier names the client and the mismatch), no token.
    logged = (tmp_path / "proxy.log").read_text()
    assert not [why for why, token in {**bad, "valid": valid}.items() if token in logged]


@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_the_callers_headers_never_reach_the_upstream_only_the_proxys_own(
    tmp_path: Path, era: str
) -> None:
    """Both eras: the upstream session of each is opened on first use, inside a caller's
    request (FastMCP's proxy client would copy that request's headers onto it), or at start."""
    ledger = tmp_path / "ledger"
    received = tmp_path / "headers.jsonl"
    alice = secrets.token_hex(24)
    upstream_secret = "Bearer " + secrets.token_hex(24)
    tokens = token_file(tmp_path, alice=alice)
    with gated_http(ledger, received) as upstream_url:
        args = ["--auth-tokens", str(tokens), "--store", "memory://", "--upstream", upstream_url]
        args += ["--upstream-header", "Authorization:UPSTREAM_AUTH"]
        env = {"UPSTREAM_AUTH": upstream_secret}
        with proxy_at(args, tmp_path / "proxy.log", env=env) as url:
            sent = {"X-Caller-Secret": "s3cret", "Cookie": "session=c00kie", "Idempotency-Key": "H"}
            async with client(url, alice, era, **sent) as as_alice:
                await as_alice.list_tools()
                guarded = await as_alice.call_tool_mcp("write", {"text": "h"})
                passed = await as_alice.call_tool_mcp("peek", {})
            assert status(guarded) == "executed" and status(passed) is None
    log = received.read_text()
    requests = [json.loads(line) for line in log.splitlines()]
    assert len(requests) >= 3  # the handshake, the listing and the calls, at least
    for headers in requests:
        assert headers["authorization"] == [upstream_secret], headers
        assert not {"x-caller-secret", "cookie", "idempotency-key"} & set(headers), headers
    assert alice not in log and "s3cret" not in log


async def test_an_open_listener_without_authentication_exits_2_before_it_starts_anything(
    tmp_path: Path,
) -> None:
    """`--listen 0.0.0.0:PORT` with neither `--auth-*` nor `--no-auth`: exit 2 naming the options,
    in under 5 s of CPU (the CLI's own start: the wall clock of a loaded shared machine measures
    the machine), the upstream never started and the port never bound."""
    started = tmp_path / "started"
    upstream = [sys.executable, "-c", f"open({str(started)!r}, 'w')"]
    argv = proxy_command("--listen", f"0.0.0.0:{free_port()}", "--store", "memory://", "--")
    ran = await anyio.to_thread.run_sync(run_to_exit, [*argv, *upstream])
    assert ran.code == 2, ran
    assert ran.cpu < 5.0 and ran.wall < 60.0, ran
    for option in ("--auth-tokens FILE", "--auth-jwt JWKS_URL", "--no-auth"):
        assert option in ran.stderr, ran
    assert "Traceback" not in ran.stderr and not await anyio.Path(started).exists()


async def test_no_auth_is_warned_about_at_start(tmp_path: Path) -> None:
    log = tmp_path / "proxy.log"
    args = ["--no-auth", "--store", "memory://", "--", *gated(tmp_path / "ledger")]
    with proxy_at(args, log) as url:
        async with client(url, None) as anyone:
            assert status(await anyone.call_tool_mcp("write", {"text": "n"}, meta=meta_key("n")))
    assert "--no-auth: the front at 127.0.0.1:0 authenticates nobody" in log.read_text()


async def test_an_oversized_body_is_413_unread_and_a_busy_principal_is_told_to_retry(
    tmp_path: Path,
) -> None:
    alice, bob = secrets.token_hex(24), secrets.token_hex(24)
    tokens = token_file(tmp_path, alice=alice, bob=bob)
    ledger = tmp_path / "ledger"
    args = ["--auth-tokens", str(tokens), "--max-body", "65536", "--max-in-flight", "2"]
    args += ["--store", "memory://", "--", *gated(ledger)]
    with proxy_at(args, tmp_path / "proxy.log") as url:
        headers = {**ACCEPT, "authorization": f"Bearer {alice}"}
        huge = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "write", "arguments": {"text": "x" * 70_000}},
            }
        ).encode()

        def chunks() -> Iterator[bytes]:
            for start in range(0, len(huge), 8192):
                yield huge[start : start + 8192]

        with httpx.Client(timeout=30) as http:
            declared = http.post(url, content=huge, headers=headers)
            chunked = http.post(url, content=chunks(), headers=headers)
            garbage = http.post(url, content=b"{" * 70_000, headers=headers)
            small_garbage = http.post(url, content=b"{" * 100, headers=headers)
        assert (declared.status_code, chunked.status_code, garbage.status_code) == (413,) * 3
        assert "chunked" in chunked.request.headers.get("transfer-encoding", "")
        assert declared.json()["error"]["data"] == {"maxBytes": 65536}
        assert small_garbage.status_code == 400  # within the bound a body is parsed (and bad)
        assert lines(ledger) == 0

        async with (
            client(url, alice) as as_alice,
            client(url, bob) as as_bob,
            anyio.create_task_group() as tasks,
        ):
            for name in ("a", "b"):
                tasks.start_soon(hold, as_alice, name)
            # Both of alice's calls are running upstream.
            await anyio.to_thread.run_sync(wait_for_lines, ledger, 2)
            with pytest.raises(MCPError) as busy:
                await as_alice.call_tool_mcp("write", {"text": "c"}, meta=meta_key("c"))
            assert busy.value.error.code == wire.STORE_UNAVAILABLE
            assert busy.value.error.data["retryAfterMs"] > 0
            # Bob's calls are his own to count: his runs, and lets alice's finish.
            released = await as_bob.call_tool_mcp("release", {}, meta=meta_key("r"))
            assert status(released) == "executed"
        async with client(url, alice) as as_alice:
            later = await as_alice.call_tool_mcp("write", {"text": "c"}, meta=meta_key("c"))
        assert status(later) == "executed"  # nothing was claimed for the refused call
    assert ledger.read_text().splitlines() == ["started a", "started b", "c"] or sorted(
        ledger.read_text().splitlines()
    ) == ["c", "started a", "started b"]


async def test_replicas_behind_nginx_authenticate_each_caller(
    tmp_path: Path, nginx_binary: str, redis_url: str
) -> None:
    """The deployed location block (`deploy/mcp-proxy.conf`) in front of two authenticating
    replicas on one Redis: nginx passes the caller's `Authorization` through to the replica that
    checks it, and the 401 back; a principal's key replays on either replica, another
    principal's same key runs its own call."""
    from nginx_server import NginxServer

    alice, bob = secrets.token_hex(24), secrets.token_hex(24)
    tokens = token_file(tmp_path, alice=alice, bob=bob)
    ledger = tmp_path / "ledger"
    separator = "&" if "?" in redis_url else "?"
    store = f"{redis_url}{separator}prefix=auth-nginx-{secrets.token_hex(4)}:"
    args = ["--auth-tokens", str(tokens), "--store", store, "--", *gated(ledger)]
    with ExitStack() as stack:
        replicas = [
            stack.enter_context(proxy_at(args, tmp_path / f"replica-{n}.log")) for n in range(2)
        ]
        hosts = [url.removeprefix("http://").removesuffix("/mcp") for url in replicas]
        nginx = NginxServer(nginx_binary, hosts)
        stack.callback(nginx.cleanup)
        await anyio.to_thread.run_sync(nginx.start)
        assert refused_401(raw_call(nginx.url, None, "N"))
        answers = []
        for token in (alice, alice, bob, alice):
            async with client(nginx.url, token) as caller:
                result = await caller.call_tool_mcp("write", {"text": "N"}, meta=meta_key("N"))
                answers.append(status(result))
        assert answers == ["executed", "replayed", "executed", "replayed"]
        assert lines(ledger) == 2
        answered_by = {request.upstreams[-1] for request in nginx.requests() if request.upstreams}
        assert answered_by == set(hosts)  # round-robin: both replicas answered
