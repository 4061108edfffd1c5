"""docker-compose.yml's `proxy` profile, checked where Docker is not: its command is one the real
`mcp-once proxy` parser accepts (front, authentication, store, upstream as the profile means
them), with the extra the proxy needs; the service is wired to the compose Redis and its token
secret, and publishes the port it listens on. The last test runs the command itself (slow tier),
the upstream replaced by the same package installed for the tests.
"""

from __future__ import annotations

import secrets
import tomllib
import uuid
from pathlib import Path

import httpx2 as httpx
import pytest
from compose_file import ROOT, compose_command, compose_services
from mcp.client import Client
from proxy_kit import NodeServers, announced, http_url, proxy_command, status, tapped

from mcp_once._cli import parse_args
from mcp_once._cli._proxy import _listen, _upstream
from mcp_once.proxy import Upstream
from orchestrator import streamable_http_transport

#: What runs `mcp-once` in the compose services: the mounted checkout, as locked, no dev group.
UV_RUN = ["uv", "run", "--frozen", "--no-dev"]
#: Where compose mounts the proxy's token file (the `proxy-tokens` secret).
TOKENS = "/run/secrets/proxy-tokens"
UPSTREAM = ("npx", "-y", "@modelcontextprotocol/server-memory")


def proxy_words() -> list[str]:
    """The profile's command after `mcp-once`, checked to be run as the other services run."""
    command = compose_command("proxy")
    assert command[: len(UV_RUN)] == UV_RUN, command
    options = command[len(UV_RUN) : command.index("mcp-once")]
    # The proxy is built on FastMCP, an optional dependency: its extra must be asked for.
    assert options == ["--extra", "fastmcp"], options
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "fastmcp" in extras["optional-dependencies"]
    return command[command.index("mcp-once") + 1 :]


def test_the_proxy_profile_command_is_one_mcp_once_proxy_accepts() -> None:
    args = parse_args(proxy_words())
    assert args.command == "proxy"
    assert _listen(args.listen) == ("0.0.0.0", 8090)
    # Every address of its container: it authenticates its callers (issue 47).
    assert args.auth_tokens == TOKENS and not args.no_auth
    assert args.store == "redis://redis:6379/0"  # the compose Redis, not the embedded default
    assert _upstream(args) == Upstream.stdio(*UPSTREAM)
    assert args.policy is None and args.upstream is None and args.config is None


def test_the_proxy_profile_service_is_wired_to_redis_and_its_port() -> None:
    services = compose_services()
    if services is None:  # the command test above still runs without PyYAML
        pytest.skip("PyYAML is not installed (not a dependency)")
    proxy = services["proxy"]
    assert proxy["profiles"] == ["proxy"]
    assert proxy["command"] == compose_command("proxy")
    assert proxy["depends_on"] == {"redis": {"condition": "service_healthy"}}
    assert proxy["secrets"] == ["proxy-tokens"]
    secret = Path(TOKENS).name
    with (ROOT / "docker-compose.yml").open() as compose:
        assert f"{secret}:\n    file: ./deploy/{secret}" in compose.read()
    assert f"deploy/{secret}" in (ROOT / ".gitignore").read_text().splitlines()  # never committed
    assert proxy["ports"] == ["127.0.0.1:8090:8090"]
    assert "8090" in " ".join(proxy["healthcheck"]["test"])
    # It exits when its stdio upstream cannot be started (npx cannot fetch the package, a crash).
    assert proxy["restart"] == "on-failure"
    # The upstream is started with npx: the image has node and npm (copied from node's image).
    assert "npx-cli.js /usr/local/bin/npx" in proxy["build"]["dockerfile_inline"]


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_proxy_profile_command_runs(
    node_servers: NodeServers, tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The profile's command as compose runs it, here: loopback and a free port for
    0.0.0.0:8090, our Redis (a prefix of its own) for the compose one, and npx's package replaced
    by the same one installed for the tests (no download mid-test), and a token file of the
    test's own for the compose secret. No token: 401. One key sent twice in the Idempotency-Key
    header: one `tools/call` upstream, the replay; a read passes through."""
    words = proxy_words()[1:]  # after `proxy`
    split = words.index("--")
    options, upstream = words[:split], words[split + 1 :]
    assert tuple(upstream) == UPSTREAM
    separator = "&" if "?" in redis_url else "?"
    token = secrets.token_hex(32)
    tokens = tmp_path / "proxy-tokens"
    tokens.write_text(f"alice {token}\n")
    tokens.chmod(0o600)
    here = {
        "0.0.0.0:8090": "127.0.0.1:0",
        "redis://redis:6379/0": f"{redis_url}{separator}prefix=compose-{uuid.uuid4().hex[:8]}:",
        TOKENS: str(tokens),
    }
    options = [here.get(word, word) for word in options]
    count = tmp_path / "tools-calls"
    monkeypatch.setenv("MEMORY_FILE_PATH", str(tmp_path / "memory.jsonl"))
    entity = {"entities": [{"name": "a", "entityType": "t", "observations": ["x"]}]}
    started = proxy_command(*options, "--", *tapped(count, node_servers.memory()))
    with announced(started, "mcp-once proxy at ") as line:
        listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        accept = {"accept": "application/json, text/event-stream"}
        async with httpx.AsyncClient() as http:
            anonymous = await http.post(http_url(line), json=listing, headers=accept)
        assert anonymous.status_code == 401, anonymous.text
        headers = {"Idempotency-Key": "compose-1", "Authorization": f"Bearer {token}"}
        async with Client(streamable_http_transport(http_url(line), headers=headers)) as client:
            first = await client.call_tool("create_entities", entity)
            second = await client.call_tool("create_entities", entity)
            graph = await client.call_tool("read_graph", {})
    assert (status(first), status(second), status(graph)) == ("executed", "replayed", None)
    assert count.read_text().splitlines() == ["create_entities", "read_graph"]
