"""The examples are documentation: each one runs, as a user would run it, and says the truth.

Servers run as real processes (`mcp-once serve-example`, `examples/server.py`, the command
docker-compose.yml gives), clients as real subprocesses; then the test checks from outside that
the charge happened exactly once per key although the client sent it twice.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from compose_file import compose_command, compose_services
from mcp import Client
from nginx_server import DEPLOY_CONF, NginxServer, check_config, deployed_config
from redis_server import RedisServer, free_port, redis_server_binary

from idempotency import CallScope, RecordState, SQLiteKeyStore, default_scope, store_key, wire
from mcp_once._cli import build_parser
from mcp_once._cli._example_server import SERVER_NAME
from orchestrator import streamable_http_transport

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SOON = 60.0
UNDER_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

SERVE_BANNER = re.compile(r"mcp-once example server at (http://\S+/mcp)")
UVICORN_BANNER = re.compile(r"Uvicorn running on (http://\S+) ")


def console_script() -> str:
    script = Path(sys.executable).with_name("mcp-once")
    assert script.exists(), f"the mcp-once console script is not installed next to {sys.executable}"
    return str(script)


class ServerProcess:
    """A server subprocess whose stderr is read line by line (and drained until it exits)."""

    def __init__(self, argv: list[str], *, cwd: Path, env: Mapping[str, str] | None = None) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, pattern: re.Pattern[str]) -> re.Match[str]:
        """The first stderr line matching `pattern` (blocks on the pipe; no polling)."""
        while True:
            try:
                line = self.lines.get(timeout=SOON)
            except queue.Empty:
                why = f"no {pattern.pattern!r} within {SOON}s: {self.seen}"
                raise AssertionError(why) from None
            if line is None:
                raise AssertionError(f"the server exited ({self.proc.wait()}): {self.seen}")
            self.seen.append(line)
            if found := pattern.search(line):
                return found

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # a clean shutdown, as Ctrl-C
            try:
                return self.proc.wait(timeout=SOON)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


@pytest.fixture(scope="module")
def private_redis() -> Iterator[RedisServer]:
    """A Redis of this module's own: the examples use the default key prefix."""
    if redis_server_binary() is None:
        message = "REDIS NOT AVAILABLE — the Redis examples cannot be tested"
        if UNDER_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    with RedisServer() as server:
        yield server


# -- what the client examples print ------------------------------------------------------------

CHARGE_LINE = re.compile(r"^charge: executed (\{.*\}) attempts=1$")
AGAIN_LINE = re.compile(r"^charge again, same key: replayed (\{.*\}) attempts=1$")
COUNT_LINE = re.compile(r"^charges for (order-[0-9a-f]{8}): 1$")


@dataclass
class ClientRun:
    order: str
    receipt: str


def run_example(*argv: str, cwd: Path = ROOT) -> list[str]:
    done = subprocess.run(
        [sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=SOON, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout.splitlines()


def check_http_client_output(lines: list[str]) -> ClientRun:
    """The HTTP client's four lines: executed, replayed (same receipt), executed, one charge."""
    assert len(lines) == 4, lines
    first, again = CHARGE_LINE.match(lines[0]), AGAIN_LINE.match(lines[1])
    assert first and again, lines
    assert again.group(1) == first.group(1)  # the replay is the first answer, byte for byte
    assert lines[2] == "set_shipping_address: executed"
    count = COUNT_LINE.match(lines[3])
    assert count, lines
    assert f"'order_id': '{count.group(1)}'" in first.group(1)
    return ClientRun(order=count.group(1), receipt=first.group(1))


async def check_once_from_outside(url: str, run: ClientRun) -> None:
    """Another client, same key: a replay of the same receipt, and still one charge."""
    key = f"charge-{run.order}"
    async with Client(streamable_http_transport(url)) as client:
        replay = await client.call_tool(
            "charge", {"order_id": run.order, "cents": 1250}, meta={wire.KEY_META: key}
        )
        listed = await client.call_tool("list_charges", {"order_id": run.order})
    marker = (replay.meta or {})[wire.IDEMPOTENCY_META]
    assert marker["status"] == "replayed" and marker["key"] == key and marker["attempts"] == 1
    assert str(replay.structured_content) == run.receipt
    assert listed.structured_content == {"result": [replay.structured_content]}


def charge_record_key(order: str) -> str:
    scope = default_scope(CallScope(SERVER_NAME, "charge", None, None, None))
    return store_key(scope, "charge", f"charge-{order}")


# -- the examples --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_serve_example_with_the_http_client_on_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "keys.sqlite3"
    server = ServerProcess(
        [console_script(), "serve-example", "--port", "0", "--store", f"sqlite:///{db}"],
        cwd=tmp_path,
    )
    try:
        url = server.wait_for(SERVE_BANNER).group(1)
        assert url.startswith("http://127.0.0.1:")
        runs = [check_http_client_output(run_example("examples/client_http.py", url))]
        runs.append(check_http_client_output(run_example("examples/client_http.py", url)))
        for run in runs:
            await check_once_from_outside(url, run)
        async with Client(streamable_http_transport(url)) as client:
            everything = await client.call_tool("list_charges", {})
        assert everything.structured_content is not None
        charges = everything.structured_content["result"]
        assert sorted(c["order_id"] for c in charges) == sorted(r.order for r in runs)
    finally:
        assert server.stop() == 0, server.seen
    # The records are in the file the server was given, one per charge key, run once each.
    store = SQLiteKeyStore(db)
    try:
        for run in runs:
            record = await store.get(charge_record_key(run.order))
            assert record is not None and record.state is RecordState.COMPLETED
            assert record.attempts == 1
    finally:
        await store.aclose()


@pytest.mark.anyio
async def test_examples_server_with_the_http_client_on_redis(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    server = ServerProcess(
        [sys.executable, str(EXAMPLES / "server.py"), "--port", "0"],
        cwd=tmp_path,
        env={"MCP_ONCE_STORE": private_redis.url},  # the store from the environment
    )
    try:
        url = server.wait_for(UVICORN_BANNER).group(1) + "/mcp"
        run = check_http_client_output(run_example("examples/client_http.py", url))
        await check_once_from_outside(url, run)
    finally:
        server.stop()
    import redis

    client = redis.Redis.from_url(private_redis.url)
    try:
        keys = {k.decode() for k in client.scan_iter(match="mcp-once:*")}
    finally:
        client.close()
    assert f"mcp-once:{{{charge_record_key(run.order)}}}" in keys
    assert not (tmp_path / ".mcp-once").exists()  # Redis given: no embedded store created


def test_stdio_pair_with_the_default_store(tmp_path: Path) -> None:
    lines = run_example(str(EXAMPLES / "stdio_pair.py"), cwd=tmp_path)
    assert len(lines) == 3, lines
    first = re.fullmatch(r"charge: executed (\{.*\})", lines[0])
    again = re.fullmatch(r"charge again, same key: replayed (\{.*\})", lines[1])
    assert first and again and first.group(1) == again.group(1)
    assert COUNT_LINE.match(lines[2])
    # The default store is the embedded SQLite file, created under the working directory.
    assert (tmp_path / ".mcp-once" / "keys.sqlite3").is_file()


def test_stdio_pair_with_a_store_url(tmp_path: Path) -> None:
    db = tmp_path / "pair.sqlite3"
    lines = run_example(str(EXAMPLES / "stdio_pair.py"), "--store", f"sqlite:///{db}")
    assert [line.split(" ", 3)[:3] for line in lines] == [
        ["charge:", "executed", "{'charge_id':"],
        ["charge", "again,", "same"],
        ["charges", "for", lines[2].split()[2]],
    ]
    assert lines[1].startswith("charge again, same key: replayed") and lines[2].endswith(": 1")
    assert db.is_file()


def test_fenced_write_refuses_the_paused_workers_write_as_the_readme_shows(tmp_path: Path) -> None:
    """The `current_claim()` example: its output is the block docs/server.md quotes."""
    db = tmp_path / "table.sqlite3"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "fenced_write.py"), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=SOON,
        check=False,
        env={**os.environ, "COLUMNS": "200"},  # one log record per line
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # The refusal is expected: reported as a tool error, no traceback (no stack frame at all).
    assert "File " not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "raised an unexpected" not in done.stderr
    page = (ROOT / "docs" / "server.md").read_text()
    quoted = page.split("execution 2 took the record over", 1)[1].split("```", 1)[0]
    assert lines == ("execution 2 took the record over" + quoted).strip().splitlines()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT fence, value FROM writes").fetchall() == [(2, "2 Side St")]
        assert conn.execute("SELECT fence FROM refused").fetchall() == [(1,)]


# -- docker-compose.yml ----------------------------------------------------------------------------


def test_docker_compose_runs_serve_example_on_redis(private_redis: RedisServer) -> None:
    command = compose_command("example-server")
    assert command[:6] == ["uv", "run", "--frozen", "--no-dev", "mcp-once", "serve-example"]
    args = build_parser().parse_args(command[5:])
    assert (args.host, args.port, args.store) == ("0.0.0.0", 8000, "redis://redis:6379/0")
    services = compose_services()  # optional: when present, the whole file must parse the same
    if services is not None:
        assert services["example-server"]["command"] == command

    server = ServerProcess(run_here(command, private_redis.url), cwd=ROOT)
    try:
        url = server.wait_for(SERVE_BANNER).group(1)
        check_http_client_output(run_example("examples/client_http.py", url))
    finally:
        assert server.stop() == 0, server.seen


def run_here(command: list[str], redis_url: str) -> list[str]:
    """A compose service's command as it runs here: the console script instead of `uv run`,
    loopback instead of all interfaces, a free port, and our Redis in place of the compose
    service's."""
    local = [console_script(), *command[5:]]
    local[local.index("0.0.0.0")] = "127.0.0.1"
    local[local.index("8000")] = "0"
    local[local.index("redis://redis:6379/0")] = redis_url
    return local


# -- docker-compose.yml, --profile scale: three replicas behind nginx ------------------------------

REPLICAS = ("replica-1", "replica-2", "replica-3")


def test_the_scale_profile_is_three_example_servers_behind_the_deployed_nginx() -> None:
    """The profile's shape: three replicas running the example-server command (no published
    port), an nginx with deploy/ mounted whose upstreams are exactly those replicas."""
    services = compose_services()
    if services is None:
        pytest.skip("PyYAML is not installed (not a dependency)")
    command = compose_command("example-server")
    port = command[command.index("--port") + 1]
    for name in REPLICAS:
        replica = services[name]
        assert replica["profiles"] == ["scale"] and replica["command"] == command, name
        assert "ports" not in replica and replica["healthcheck"]["test"][0] == "CMD"
    nginx = services["nginx"]
    assert nginx["profiles"] == ["scale"] and nginx["ports"] == ["127.0.0.1:8080:8080"]
    assert set(nginx["depends_on"]) == set(REPLICAS)
    mounts = {m.split(":")[0]: m.split(":")[1] for m in nginx["volumes"]}
    assert mounts == {
        "./deploy/nginx.conf": "/etc/nginx/nginx.conf",
        "./deploy/mcp-proxy.conf": "/etc/nginx/mcp-proxy.conf",
    }
    assert all((ROOT / source).is_file() for source in mounts)
    upstreams = re.findall(r"^\s*server (\S+) ", DEPLOY_CONF.read_text(), re.MULTILINE)
    assert upstreams == [f"{name}:{port}" for name in REPLICAS]
    assert "listen 8080;" in DEPLOY_CONF.read_text()


def test_the_deployed_nginx_config_passes_nginx_t(nginx_binary: str, tmp_path: Path) -> None:
    """`nginx -t` on deploy/nginx.conf, the compose host names replaced by loopback addresses
    (they resolve only inside compose)."""
    conf = deployed_config([f"127.0.0.1:{8001 + n}" for n in range(3)], free_port(), tmp_path)
    checked = check_config(nginx_binary, conf)
    assert checked.returncode == 0, checked.stderr
    assert "syntax is ok" in checked.stderr


@pytest.mark.anyio
async def test_the_scale_profile_charges_once_through_nginx(
    private_redis: RedisServer, nginx_binary: str
) -> None:
    """The profile run here as compose runs it (see `run_here`, `deployed_config`): three
    `serve-example` replicas on one Redis behind nginx with deploy/nginx.conf. A charge sent six
    times with one key through nginx, which spreads them over the replicas, runs once: the
    first is executed, the five others are replays, and the replicas' own ledgers, read
    directly, hold one charge between them."""
    command = run_here(compose_command("example-server"), private_redis.url)
    servers = [ServerProcess(command, cwd=ROOT) for _ in REPLICAS]
    try:
        urls = [server.wait_for(SERVE_BANNER).group(1) for server in servers]
        upstreams = [url.removeprefix("http://").removesuffix("/mcp") for url in urls]
        with NginxServer(nginx_binary, upstreams, deployed=True) as nginx:
            order, key = f"order-{uuid.uuid4().hex[:8]}", f"charge-{uuid.uuid4()}"
            statuses = []
            async with Client(streamable_http_transport(nginx.url)) as client:
                for _ in range(6):
                    result = await client.call_tool(
                        "charge", {"order_id": order, "cents": 700}, meta={wire.KEY_META: key}
                    )
                    marker = (result.meta or {})[wire.IDEMPOTENCY_META]
                    statuses.append(marker["status"])
        charges = 0
        for url in urls:
            async with Client(streamable_http_transport(url)) as client:
                listed = await client.call_tool("list_charges", {"order_id": order})
            assert listed.structured_content is not None
            charges += len(listed.structured_content["result"])
    finally:
        for server in servers:
            assert server.stop() == 0, server.seen
    assert statuses == ["executed"] + ["replayed"] * 5, statuses
    assert charges == 1


# -- the agent-framework examples (no LLM, no network: stand-in models) ---------------------------

FRAMEWORK_EXAMPLES = {
    "fastmcp_client.py": re.compile(r"charge \(first answer lost\): replayed (\{.*\})"),
    "pydantic_ai_agent.py": re.compile(r"charged: (\{.*\})"),
    "openai_agents_agent.py": re.compile(r"charged: (\{.*\})"),
}


@pytest.mark.anyio
@pytest.mark.parametrize("example", sorted(FRAMEWORK_EXAMPLES))
async def test_framework_examples_charge_once_through_a_lost_answer(
    example: str, tmp_path: Path
) -> None:
    """Each example loses the first answer to `charge` and still charges once: its output says
    so, and the server's key store (read here, from outside) has one record, executed once."""
    db = tmp_path / "keys.sqlite3"
    lines = run_example(str(EXAMPLES / example), "--store", f"sqlite:///{db}", cwd=tmp_path)
    assert len(lines) == 2, lines
    assert FRAMEWORK_EXAMPLES[example].fullmatch(lines[0]), lines
    assert COUNT_LINE.match(lines[1]), lines
    store = SQLiteKeyStore(db)
    try:
        records = await store.list_records(state=RecordState.COMPLETED)
    finally:
        await store.aclose()
    assert [record.attempts for record in records] == [1]
