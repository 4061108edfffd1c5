"""`mcp-once proxy` in front of servers it did not write, as real processes (the slow tier).

The upstream: `ledger_server.mjs` (the TypeScript SDK, an effect ledger the server appends to and
fsyncs before answering, so what is counted is what happened); the npm reference servers are in
`test_proxy_npm.py`. The proxy runs as the `mcp-once proxy` command (stdio front, `--listen` HTTP
front) or, where a test must watch the upstream link itself, in this process through the Python
API.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types
import pytest
from mcp import MCPError, StdioServerParameters
from mcp.client import Client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from proxy_kit import (
    MARKER,
    InProcess,
    NodeServers,
    announced,
    conformance_fixture,
    desktop_configs,
    http_url,
    initialize_request,
    lines,
    meta_key,
    node_port_url,
    proxied_fixture,
    proxy_command,
    status,
    text,
)

from idempotency import MemoryKeyStore, RecordState, open_store, parse_history, wire
from mcp_once.proxy import OnceProxy, Upstream, build_proxy, parse_policy
from orchestrator import RetryingSession, RetryPolicy, streamable_http_transport
from orchestrator.chaos import Chaos, Fault, FaultPlan

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

#: Long enough for a call through the proxy to a node child; the lost answer waits this long.
ATTEMPT = 5.0
WAIT = 30.0


def _stdio(command: list[str]) -> StdioServerParameters:
    return StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    folder = tmp_path / "ledger"
    folder.mkdir()
    return folder


@asynccontextmanager
async def ledger_proxy(
    node_servers: NodeServers, ledger: Path, **options: Any
) -> AsyncIterator[tuple[OnceProxy, InProcess]]:
    """The proxy in this process (so a test can watch its upstream link) in front of a stdio
    ledger server, and a client of it."""
    upstream = Upstream.stdio(*node_servers.ledger(ledger))
    store = options.pop("store", None) or MemoryKeyStore()
    proxy = build_proxy(upstream, store, **options)
    async with proxy.opened(), InProcess(proxy) as client:
        yield proxy, client


async def _lost_answer_then_replay(
    target: StdioServerParameters | str, ledger: Path, mode: str = "auto"
) -> None:
    """The first answer is lost on the caller's link; the caller's retry re-sends the same key;
    the upstream got one `tools/call`, the caller gets the replay. A read passes through.
    `mode`: the caller's protocol era (`mcp.client.Client`'s)."""
    chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK}, tools={"charge"}), seed=1)
    async with Client(chaos.wrap(target), mode=mode) as client:
        retrying = RetryingSession(client, policy=RetryPolicy(attempt_timeout=ATTEMPT))
        result = await retrying.call_tool("charge", {"amount": 5}, idempotency_key="order-1")
        assert not result.is_error and text(result) == "charged 5 (#1)"
        assert status(result) == "replayed"
        assert [a.failure for a in retrying.last_report.attempts] == ["maybe_executed", None]
        assert lines(ledger / "calls") == 1 and lines(ledger / "effects") == 1
        sent = json.loads((ledger / "calls").read_text())
        assert sent["key"].startswith("mcp-once:") and "order-1" not in sent["key"]
        # The same key once more: still one effect, the record's answer.
        again = await client.call_tool("charge", {"amount": 5}, meta=meta_key("order-1"))
        assert status(again) == "replayed" and lines(ledger / "calls") == 1
        # A read-only tool passes through: no record, no marker, the upstream answers.
        read = await client.call_tool("balance", {}, meta=meta_key("read-1"))
        assert text(read) == "1" and status(read) is None


async def test_stdio_front_stdio_upstream_lost_answer(
    node_servers: NodeServers, ledger: Path, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    command = proxy_command("--store", store, "--", *node_servers.ledger(ledger))
    await _lost_answer_then_replay(_stdio(command), ledger)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_http_front_http_upstream_lost_answer(
    node_servers: NodeServers, ledger: Path, tmp_path: Path, mode: str
) -> None:
    """Over HTTP both ways, in each protocol era: a handshake-era caller's guarded call takes
    the fast path's raw send to the upstream (`fast_path._sent`), a 2026-07-28 one's FastMCP's
    path and the link's own call."""
    with announced(node_servers.ledger(ledger, "--port", "0"), "PORT ", stream="stdout") as port:
        store = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
        command = proxy_command(
            "--store", store, "--listen", "127.0.0.1:0", "--upstream", node_port_url(port)
        )
        with announced(command, "mcp-once proxy at ") as announcement:
            await _lost_answer_then_replay(http_url(announcement), ledger, mode)


async def test_is_error_result_is_stored_and_replayed(
    node_servers: NodeServers, ledger: Path
) -> None:
    async with ledger_proxy(node_servers, ledger) as (_, client):
        first = await client.call_tool("charge", {"amount": -1}, meta=meta_key("declined"))
        again = await client.call_tool("charge", {"amount": -1}, meta=meta_key("declined"))
        assert first.is_error and again.is_error and text(again) == "declined"
        assert (status(first), status(again)) == ("executed", "replayed")
        assert lines(ledger / "calls") == 1


async def test_upstream_killed_after_its_effect_is_outcome_unknown(
    node_servers: NodeServers, ledger: Path, tmp_path: Path
) -> None:
    """SIGKILLed after the effect, before the answer: -32012, nothing stored, the record settles
    with `mcp-once keys settle`; the next call starts a new child."""
    store = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    command = proxy_command("--store", store, "--", *node_servers.ledger(ledger))
    async with Client(_stdio(command)) as client:
        first_pid = text(await client.call_tool("pid", {}))
        with pytest.raises(MCPError) as caught:
            await client.call_tool(
                "charge", {"amount": 6, "crash": "after"}, meta=meta_key("crashed")
            )
        assert caught.value.code == wire.OUTCOME_UNKNOWN
        assert lines(ledger / "effects") == 1
        after = await client.call_tool("charge", {"amount": 7}, meta=meta_key("next"))
        assert status(after) == "executed" and lines(ledger / "effects") == 2
        assert text(await client.call_tool("pid", {})) != first_pid


async def test_upstream_dead_before_the_write_is_sent_to_a_new_child(
    node_servers: NodeServers, ledger: Path
) -> None:
    """The child died before the proxy wrote the call: the call goes to a fresh child, once."""
    async with ledger_proxy(node_servers, ledger) as (proxy, client):
        pid = int(text(await client.call_tool("pid", {})))
        os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(WAIT):
            while proxy.link.alive():  # noqa: ASYNC110 (the SDK's closed flag has no event)
                await anyio.sleep(0.01)
        result = await client.call_tool("charge", {"amount": 8}, meta=meta_key("after-death"))
        assert status(result) == "executed" and text(result) == "charged 8 (#1)"
        assert lines(ledger / "effects") == 1 and proxy.link.connects == 2


async def test_concurrent_duplicates_get_one_effect(
    node_servers: NodeServers, ledger: Path
) -> None:
    """A client that double-dispatches: both copies answered, one effect (rule 5)."""
    answers = []
    async with ledger_proxy(node_servers, ledger) as (_, client):

        async def call() -> None:
            answers.append(await client.call_tool("charge", {"amount": 9}, meta=meta_key("dup")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            tg.start_soon(call)
    assert sorted(status(a) or "" for a in answers) == ["executed", "replayed"]
    assert lines(ledger / "effects") == 1


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each store the proxy's in-doubt record must turn UNKNOWN on at once."""
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    redis_url: str = request.getfixturevalue("redis_url")
    return f"{redis_url}?prefix=px-fail-{uuid.uuid4().hex[:8]}:"


async def test_in_doubt_record_turns_unknown_at_once_and_settles(
    node_servers: NodeServers, ledger: Path, store_url: str
) -> None:
    """The upstream child SIGKILLed after its effect, before its answer: the caller gets -32012
    at once (the lease is 30 s, the call comes back in a fraction of it), the record is UNKNOWN
    already (its history says `interrupted`), a re-send gets -32012, never -32010, and is never
    sent upstream; `mcp-once keys settle` completes it with the effect that happened."""
    from mcp_once._cli import main

    lease = 30.0
    store = open_store(store_url)
    async with ledger_proxy(node_servers, ledger, store=store, lease=lease) as (proxy, client):
        crash = {"amount": 6, "crash": "after"}
        started = anyio.current_time()
        with pytest.raises(MCPError) as caught:
            await client.call_tool("charge", crash, meta=meta_key("crashed"))
        took = anyio.current_time() - started
        print(f"[stdio child killed mid-call, {store_url[:6]}] -32012 after {took:.2f} s")
        assert caught.value.code == wire.OUTCOME_UNKNOWN
        assert took < lease / 3, f"the in-doubt answer took {took:.1f} s"
        (record,) = await store.list_records()
        assert record.state is RecordState.UNKNOWN and record.tool == "charge"
        events = parse_history(await store.history(record.key))  # type: ignore[attr-defined]
        assert [e.kind for e in events] == ["claimed", "interrupted"]
        assert events[1].details == {
            "why": "the upstream process exited while the call ran; its effect may have happened",
            "ended": "yes",
        }
        with pytest.raises(MCPError) as again:
            await client.call_tool("charge", crash, meta=meta_key("crashed"))
        assert again.value.code == wire.OUTCOME_UNKNOWN  # not IN_PROGRESS (-32010)
        assert lines(ledger / "calls") == 1 and lines(ledger / "effects") == 1
        if store_url.startswith("memory"):
            return  # `keys` reads the store from another process's view: not a memory store
        listed = ["keys", "list", "--store", store_url, "--state", "unknown", "--json"]
        shown = await anyio.to_thread.run_sync(_stdout_of, main, listed)
        assert [(r["key"], r["state"]) for r in json.loads(shown)] == [(record.key, "unknown")]
        named = ["--client-key", "crashed", "--tool", "charge", "--server", proxy.name]
        verdict = ["--result-text", "charged 6 (#1)"]
        settled = await anyio.to_thread.run_sync(
            main, ["keys", "settle", "--store", store_url, *named, *verdict]
        )
        assert settled == 0
        replay = await client.call_tool("charge", crash, meta=meta_key("crashed"))
        assert text(replay) == "charged 6 (#1)" and status(replay) == "replayed"
        assert lines(ledger / "calls") == 1 and lines(ledger / "effects") == 1


async def test_an_http_upstream_dying_mid_call_turns_the_record_unknown_at_once(
    node_servers: NodeServers, ledger: Path
) -> None:
    """The HTTP stream broke: the upstream HTTP server SIGKILLed after its effect, before its
    answer. -32012 at once, the record UNKNOWN at once, a re-send -32012 (not -32010), one
    effect."""
    lease = 30.0
    store = MemoryKeyStore()
    with announced(node_servers.ledger(ledger, "--port", "0"), "PORT ", stream="stdout") as port:
        proxy = build_proxy(Upstream.http(node_port_url(port)), store, lease=lease)
        async with proxy.opened(), InProcess(proxy) as client:
            crash = {"amount": 2, "crash": "after"}
            started = anyio.current_time()
            with pytest.raises(MCPError) as caught:
                await client.call_tool("charge", crash, meta=meta_key("stream-broke"))
            took = anyio.current_time() - started
            with pytest.raises(MCPError) as again:
                await client.call_tool("charge", crash, meta=meta_key("stream-broke"))
    print(f"[http upstream killed mid-call] -32012 after {took:.2f} s (lease {lease:g} s)")
    broke = "the connection to the upstream broke while the call ran; its effect may have happened"
    assert broke in caught.value.message and broke in again.value.message
    assert caught.value.code == wire.OUTCOME_UNKNOWN and took < lease / 3
    assert again.value.code == wire.OUTCOME_UNKNOWN
    (record,) = await store.list_records()
    assert record.state is RecordState.UNKNOWN
    assert lines(ledger / "calls") == 1 and lines(ledger / "effects") == 1


def _stdout_of(main: Any, argv: list[str]) -> str:
    """What the CLI's `main(argv)` prints (it must exit 0)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()


async def test_tools_command_lists_what_the_proxy_does(
    node_servers: NodeServers, ledger: Path
) -> None:
    """`mcp-once tools --json` against a real upstream, with a policy pattern matching nothing
    (the nearest tool name suggested) and one whose options are said in words."""
    policy = ledger / "policy.toml"
    policy.write_text('[tools."chrage"]\nguard = false\n[tools."charge"]\nretention = 3600\n')
    command = [sys.executable, "-m", "mcp_once", "tools", "--json", "--policy", str(policy)]
    with anyio.fail_after(120):
        done = await anyio.run_process([*command, "--", *node_servers.ledger(ledger)], check=False)
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    assert rows["charge"]["action"] == "guarded"
    assert rows["charge"]["annotations"] == {"destructive": True, "idempotent": False}
    assert rows["charge"]["effects"] == [
        "retention = 3600 s (1 h): a keyed answer is replayed that long (default 86400 s (1 d))"
    ]
    assert rows["balance"]["action"] == "pass-through"
    assert "policy pattern 'chrage' matches no tool of the upstream; did you mean 'charge'?" in (
        stderr
    )


async def test_the_desktop_config_snippet_starts(node_servers: NodeServers, tmp_path: Path) -> None:
    """docs/proxy.md's first desktop snippet, started as a client would start it (the npx
    upstream replaced by the same package installed for the tests: no download mid-test)."""
    entry = desktop_configs()[0]
    split = entry["args"].index("--")
    assert entry["args"][split + 1 :] == ["npx", "-y", "@modelcontextprotocol/server-memory"]
    options = [*entry["args"][1:split], "--store", f"sqlite:///{tmp_path / 'k.sqlite3'}"]
    command = proxy_command(*options, "--", *node_servers.memory())
    env = {**os.environ, "MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")}
    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    async with Client(params) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert {"create_entities", "read_graph"} <= names


async def test_upstream_idempotent_tools_are_resent_under_the_same_key(
    node_servers: NodeServers, ledger: Path
) -> None:
    """The policy says the upstream tool may run twice: after the child died mid-call the proxy
    re-sends it to a new child under the same upstream key, and the caller gets the answer."""
    policy = parse_policy({"tools": {"charge": {"upstream_idempotent": True}}})
    async with ledger_proxy(node_servers, ledger, policy=policy) as (proxy, client):
        args = {"amount": 3, "crash": "after-once"}
        result = await client.call_tool("charge", args, meta=meta_key("resent"))
        assert status(result) == "executed" and not result.is_error
        sent = [json.loads(line)["key"] for line in (ledger / "calls").read_text().splitlines()]
        assert len(sent) == 2 and sent[0] == sent[1]  # one upstream key for both sends
        assert proxy.link.connects == 2


#: What `consult` answers, by what it asks its caller (the front client's answers below).
CONSULTED = {
    "sampling": "sampling: teal",
    "elicitation": 'elicitation: accept {"ok":true}',
    "roots": "roots: file:///work/roots-a",
}


@pytest.mark.parametrize(("ask", "guarded"), [(a, True) for a in CONSULTED] + [("sampling", False)])
async def test_log_lines_and_questions_reach_the_caller_of_the_first_execution_only(
    node_servers: NodeServers, ledger: Path, ask: str, guarded: bool
) -> None:
    """The upstream's log line and its sampling / elicitation / roots request reach the caller
    of a guarded call's first execution, over a 2025-era front (the one with server-to-client
    requests); its replay carries the result only: no log line, no question, no upstream call.
    A passed-through call forwards them too, each time it runs."""
    from fastmcp import Client as FastMCPClient
    from fastmcp.client.elicitation import ElicitResult

    logs: list[Any] = []
    asked: list[str] = []

    async def on_log(message: Any) -> None:
        data = message.data  # FastMCP relays a line as {"msg": ..., "extra": ...}
        logs.append(data["msg"] if isinstance(data, dict) else data)

    async def on_sampling(messages: Any, params: Any, context: Any) -> str:
        asked.append("sampling")
        return "teal"

    async def on_elicitation(message: str, kind: Any, params: Any, context: Any) -> Any:
        asked.append("elicitation")
        return ElicitResult(action="accept", content={"ok": True})

    async def on_roots(context: Any) -> list[str]:
        asked.append("roots")
        return ["file:///work/roots-a"]

    policy = parse_policy({"tools": {"consult": {"guard": guarded}}})
    proxy = build_proxy(
        Upstream.stdio(*node_servers.ledger(ledger)), MemoryKeyStore(), policy=policy
    )
    front = FastMCPClient(
        proxy,
        mode="legacy",
        log_handler=on_log,
        sampling_handler=on_sampling,
        elicitation_handler=on_elicitation,
        roots=on_roots,
    )
    arguments = {"ask": ask}
    async with proxy.opened(), front:
        first = await front.call_tool_mcp("consult", arguments, meta=meta_key(f"ask-{ask}"))
        assert not first.is_error and text(first) == CONSULTED[ask]
        assert logs == ["consulting #1"] and asked == [ask]
        again = await front.call_tool_mcp("consult", arguments, meta=meta_key(f"ask-{ask}"))
        assert text(again) == CONSULTED[ask]
    if guarded:
        assert (status(first), status(again)) == ("executed", "replayed")
        assert len(logs) == 1 and asked == [ask]  # the replay: the result only
        assert lines(ledger / "calls") == 1 and lines(ledger / "effects") == 1
    else:
        assert (status(first), status(again)) == (None, None)
        assert logs == ["consulting #1", "consulting #2"]
        assert asked == [ask, ask] and lines(ledger / "effects") == 2


@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_a_task_augmented_call_to_an_upstream_without_tasks_is_guarded(
    node_servers: NodeServers, ledger: Path, era: str
) -> None:
    """A call whose caller declares the tasks extension (SEP-2663) to a guarded tool is guarded
    as any call (rule 23); this upstream (stdio: a 2025-11-25 link) has no tasks, so it runs the
    call plain and its result is the record's answer: executed once, then replayed. On a
    2025-era front the caller cannot declare the extension at all (the SDK keeps no per-request
    capabilities there): the same. The listing's `io.github.mcp-once/proxy` entry names no
    unguarded call. (An upstream with tasks: test_proxy_tasks.py.)"""
    from fastmcp import Client as FastMCPClient

    from orchestrator import TasksExtension

    store = MemoryKeyStore()
    proxy = build_proxy(Upstream.stdio(*node_servers.ledger(ledger)), store)
    extensions = [TasksExtension()]
    async with proxy.opened(), FastMCPClient(proxy, mode=era, extensions=extensions) as front:
        listed = {t.name: t for t in await front.list_tools()}
        assert (listed["charge"].meta or {})[wire.PROXY_META] == {
            "unguarded": [],
            "neverStored": ["inputRequired"],
        }
        assert wire.PROXY_META not in (listed["balance"].meta or {})  # passed through anyway
        answers = [
            await front.call_tool_mcp("charge", {"amount": 3}, meta=meta_key("task-1"))
            for _ in range(2)
        ]
        assert [status(r) for r in answers] == ["executed", "replayed"]
        assert all(isinstance(r, mcp_types.CallToolResult) for r in answers)
        assert len(await store.list_records()) == 1
    assert lines(ledger / "effects") == 1


async def test_max_run_time_from_the_policy_is_outcome_unknown(
    node_servers: NodeServers, ledger: Path
) -> None:
    """`max_run_time` in the policy bounds the upstream call: past it, -32012, nothing stored."""
    policy = parse_policy({"tools": {"charge": {"max_run_time": 0.5}}})
    async with ledger_proxy(node_servers, ledger, policy=policy) as (_, client):
        with pytest.raises(MCPError) as caught:
            slow = {"amount": 4, "wait_ms": 5000}
            await client.call_tool("charge", slow, meta=meta_key("slow"))
        assert caught.value.code == wire.OUTCOME_UNKNOWN
        assert lines(ledger / "effects") == 1


async def test_listen_mode_reads_the_idempotency_key_header(
    node_servers: NodeServers, ledger: Path
) -> None:
    """`--listen` reads the `Idempotency-Key` header by default: two calls under one header
    value, no `_meta` key, reach the upstream once."""
    command = proxy_command("--store", "memory://", "--listen", "127.0.0.1:0", "--")
    with announced([*command, *node_servers.ledger(ledger)], "mcp-once proxy at ") as line:
        headers = {"Idempotency-Key": "header-key-1"}
        async with Client(streamable_http_transport(http_url(line), headers=headers)) as client:
            first = await client.call_tool("charge", {"amount": 2})
            second = await client.call_tool("charge", {"amount": 2})
    assert (status(first), status(second)) == ("executed", "replayed")
    assert lines(ledger / "calls") == 1


TS_CLIENT = Path(__file__).parents[1] / "clients_real" / "ts_sdk_client.mjs"


@pytest.mark.parametrize("front", ["stdio", "http"])
async def test_typescript_sdk_client_through_the_proxy(
    node_servers: NodeServers, ledger: Path, front: str
) -> None:
    """The TypeScript SDK's client, the same key twice: one upstream call, the replay marker."""
    upstream = node_servers.ledger(ledger)
    call = {"op": "call", "name": "charge", "arguments": {"amount": 1}, "meta": meta_key("ts-1")}
    with contextlib.ExitStack() as stack:
        if front == "stdio":
            command = proxy_command("--store", "memory://", "--", *upstream)
            connect = {"op": "connect", "command": command[0], "args": command[1:]}
        else:
            command = proxy_command("--store", "memory://", "--listen", "127.0.0.1:0", "--")
            line = stack.enter_context(announced([*command, *upstream], "mcp-once proxy at "))
            connect = {"op": "connect", "url": http_url(line)}
        script = "".join(json.dumps(c) + "\n" for c in (connect, call, call))
        with anyio.fail_after(120):
            done = await anyio.run_process(
                [node_servers.node, str(TS_CLIENT), str(node_servers.prefix)],
                input=script.encode(),
                check=False,
            )
    answers = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert len(answers) == 3 and all("result" in a for a in answers), done.stderr.decode()
    first, second = answers[1]["result"], answers[2]["result"]
    assert first["_meta"][MARKER]["status"] == "executed"
    assert second["_meta"][MARKER]["status"] == "replayed"
    assert second["content"] == first["content"]
    assert lines(ledger / "calls") == 1


async def test_proxy_killed_mid_call_and_restarted_on_the_same_store(
    node_servers: NodeServers, ledger: Path, tmp_path: Path
) -> None:
    """The proxy itself SIGKILLed while the upstream runs the call: its lease runs out, and a new
    proxy on the same store answers the re-send -32012 (UNKNOWN), never a second effect."""
    store = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    pid_file = tmp_path / "proxy.pid"
    script = str(Path(__file__).parent / "proxy_process.py")
    command = [sys.executable, script, store, "1.0", str(pid_file), "--"]
    command += node_servers.ledger(ledger)
    slow = {"amount": 5, "wait_ms": 20000}
    upstream_pid = 0
    async with Client(_stdio(command)) as first:
        upstream_pid = int(text(await first.call_tool("pid", {})))

        async def doomed() -> None:
            with contextlib.suppress(Exception):
                await first.call_tool("charge", slow, meta=meta_key("mid-call"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(doomed)
            with anyio.fail_after(WAIT):
                while lines(ledger / "effects") < 1:  # noqa: ASYNC110 (a file is the only signal)
                    await anyio.sleep(0.01)
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(upstream_pid, signal.SIGKILL)  # the first proxy's orphaned child
    async with Client(_stdio(command)) as second:
        with pytest.raises(MCPError) as caught:
            await second.call_tool("charge", slow, meta=meta_key("mid-call"))
        assert caught.value.code == wire.OUTCOME_UNKNOWN
    assert lines(ledger / "calls") == 1 and lines(ledger / "effects") == 1


async def test_proxy_from_a_desktop_config_entry(
    node_servers: NodeServers, ledger: Path, tmp_path: Path
) -> None:
    """`--config FILE --server NAME`: the entry's command, args and env start the upstream."""
    node, *args = node_servers.ledger(ledger)
    entry = {"command": node, "args": args, "env": {"LEDGER_NOTE": "from-config"}}
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"ledger": entry}}))
    command = proxy_command("--store", "memory://", "--config", str(config), "--server", "ledger")
    async with Client(_stdio(command)) as client:
        result = await client.call_tool("charge", {"amount": 1}, meta=meta_key("cfg-1"))
        assert status(result) == "executed" and lines(ledger / "effects") == 1


async def test_a_guarded_calls_logs_and_sampling_reach_its_first_caller_only() -> None:
    """The upstream's log notifications and sampling request during a guarded call reach the
    caller of the first execution; the replay carries the result alone. Completion requests are
    answered by the upstream, and its schemas are listed as it wrote them ($defs kept)."""
    from fastmcp import Client as FastMCPClient
    from mcp_types import LoggingMessageNotificationParams, PromptReference

    logs: list[LoggingMessageNotificationParams] = []
    prompts: list[str] = []

    async def log(message: LoggingMessageNotificationParams) -> None:
        logs.append(message)

    async def sample(messages: list[Any], params: Any, context: Any) -> str:
        prompts.append(str(messages[0].content.text))
        return "sampled"

    with conformance_fixture() as url:
        proxy = build_proxy(Upstream.http(url), MemoryKeyStore())
        # The handshake era: the in-memory modern one has no channel for sampling requests.
        client = FastMCPClient(proxy, log_handler=log, sampling_handler=sample, mode="legacy")
        async with proxy.opened(), client:
            calls = [
                await client.call_tool_mcp("test_tool_with_logging", {}, meta=meta_key("log-1"))
                for _ in range(2)
            ]
            assert [status(c) for c in calls] == ["executed", "replayed"]
            assert len(logs) == 3  # the fixture logs three times, in the first execution only
            arguments = {"prompt": "p-1"}
            sampled = [
                await client.call_tool_mcp("test_sampling", arguments, meta=meta_key("s-1"))
                for _ in range(2)
            ]
            assert [status(c) for c in sampled] == ["executed", "replayed"]
            assert [text(c) for c in sampled] == ["LLM response: sampled"] * 2
            assert prompts == ["p-1"]
            ref = PromptReference(type="ref/prompt", name="test_prompt_with_arguments")
            completion = await client.complete(ref, {"name": "arg1", "value": "a"})
            assert completion.values == []  # the fixture's answer, not -32601
            listed = {t.name: t for t in await client.list_tools()}
            assert "$defs" in listed["json_schema_2020_12_tool"].input_schema


async def test_listen_on_loopback_refuses_a_foreign_host() -> None:
    """DNS rebinding: a `--listen` proxy on a loopback address answers a request naming another
    Host 421, and serves one naming its own."""
    body = initialize_request()

    def post(url: str, host: str | None) -> int:
        headers = {"Accept": "application/json, text/event-stream"}
        headers["Content-Type"] = "application/json"
        if host is not None:
            headers["Host"] = host
        request = urllib.request.Request(url, json.dumps(body).encode(), headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as refused:
            return int(refused.code)

    with proxied_fixture("memory://") as url:
        foreign = await anyio.to_thread.run_sync(post, url, "evil.example.com")
        own = await anyio.to_thread.run_sync(post, url, None)
    assert (foreign, own) == (421, 200)


async def test_a_2026_callers_input_required_round_passes_through_unstored(
    tmp_path: Path,
) -> None:
    """A 2026-07-28 caller's SEP-2322 round through the proxy (a keyless call, passed through):
    the upstream's question reaches the caller as an `InputRequiredResult` (its client's
    elicitation callback answers it), the answer goes upstream as the continuation, and nothing
    is stored (rule 8). Fails with one handshake-era upstream session ('Handler returned an
    invalid result'). The 2025 era's sampling relay is
    `test_a_guarded_calls_logs_and_sampling_reach_its_first_caller_only`."""
    asked: list[str] = []

    async def elicit(context: Any, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
        asked.append(params.message)
        return mcp_types.ElicitResult(action="accept", content={"name": "Ann"})

    store_url = f"sqlite:///{tmp_path / 'k.sqlite3'}"
    with proxied_fixture(store_url) as url:
        async with Client(url, elicitation_callback=elicit) as client:
            assert client.protocol_version in MODERN_PROTOCOL_VERSIONS
            for _ in range(2):
                result = await client.call_tool("test_input_required_result_elicitation", {})
                assert text(result) == "Hello, Ann!"
    assert asked == ["What is your name?"] * 2  # one question per call, from the upstream
    store = open_store(store_url)
    try:
        assert await store.list_records() == []
    finally:
        await store.aclose()


@pytest.mark.parametrize(
    ("tool", "content", "final"),
    [
        ("test_input_required_result_elicitation", {"name": "Ann"}, "Hello, Ann!"),
        # The upstream's sealed requestState goes back to the caller and returns with the answer.
        (
            "test_input_required_result_request_state",
            {"ok": True},
            "state-ok: requestState validated (ok=True)",
        ),
    ],
    ids=["elicitation", "request_state"],
)
async def test_a_2026_callers_keyed_round_to_a_guarded_tool_runs_it_once_and_is_replayed(
    tmp_path: Path, tool: str, content: dict[str, Any], final: str
) -> None:
    """A keyed call from a 2026-07-28 caller to a guarded tool whose upstream asks for input:
    the upstream's question reaches the caller (its elicitation callback answers it) and the
    claim is released (rule 8); the answer goes upstream as the continuation under the same
    key, claims again and stores the final result; the same key again is a replay that never
    reaches the upstream (no second question). Fails when the proxy's client answers the round
    itself (the question cannot reach a 2026-07-28 caller as a request)."""
    asked: list[str] = []

    async def elicit(context: Any, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
        asked.append(params.message)
        return mcp_types.ElicitResult(action="accept", content=content)

    store_url = f"sqlite:///{tmp_path / 'k.sqlite3'}"
    with proxied_fixture(store_url) as url:
        async with Client(url, elicitation_callback=elicit) as client:
            assert client.protocol_version in MODERN_PROTOCOL_VERSIONS
            first = await client.call_tool(tool, {}, meta=meta_key("round-1"))
            again = await client.call_tool(tool, {}, meta=meta_key("round-1"))
    assert (text(first), status(first)) == (final, "executed")
    assert (text(again), status(again)) == (final, "replayed")
    assert len(asked) == 1  # one question: the upstream ran the tool once
    store = open_store(store_url)
    try:
        (record,) = await store.list_records()
        assert record.state is RecordState.COMPLETED and record.tool == tool
        events = parse_history(await store.history(record.key))  # type: ignore[attr-defined]
    finally:
        await store.aclose()
    kinds = [e.kind for e in events]
    assert kinds == ["claimed", "released", "claimed", "completed", "replayed"]
    assert events[1].details == {"why": "input_required"}


async def test_callers_of_both_eras_share_one_stdio_child(
    node_servers: NodeServers, ledger: Path
) -> None:
    """In front of a stdio upstream the proxy keeps one child whatever era its callers speak: a
    second child would split a stateful server's state (here the ledger's charge counter, kept in
    the child's memory) between a 2025-era and a 2026-07-28 caller."""
    from fastmcp import Client as FastMCPClient

    proxy = build_proxy(Upstream.stdio(*node_servers.ledger(ledger)), MemoryKeyStore())
    legacy, modern = FastMCPClient(proxy, mode="legacy"), FastMCPClient(proxy)
    async with proxy.opened(), legacy as old, modern as new:
        assert new.protocol_version in MODERN_PROTOCOL_VERSIONS
        assert old.protocol_version not in MODERN_PROTOCOL_VERSIONS
        pids = {text(await c.call_tool_mcp("pid", {})) for c in (old, new)}
        charged = [
            text(await c.call_tool_mcp("charge", {"amount": 1}, meta=meta_key(f"k-{n}")))
            for n, c in enumerate((old, new, old))
        ]
    assert len(pids) == 1 and proxy.link.connects == 1
    assert charged == ["charged 1 (#1)", "charged 1 (#2)", "charged 1 (#3)"]
