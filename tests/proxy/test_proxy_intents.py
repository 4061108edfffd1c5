"""Rule 18 through `mcp-once proxy` in front of an upstream that honours idempotency keys itself (a
Python server guarded by mcp-once, `guarded_upstream.py`): the upstream key names the intent.

It stays the same for every execution that may be the same effect, so the upstream's own record
protects the caller where it ran after all (a re-send after an upstream SIGKILL under
`upstream_idempotent`, a retry after `mcp-once keys settle --failed`), and changes for a new
intent (a keyless call repeated after its answer was delivered, rule 15), which the upstream must
run rather than replay. An upstream's replay reaches the caller as one (`status: replayed` with
`upstream: true`), never as `executed`.

The proxy runs as the `mcp-once proxy` command, over stdio and `--listen` (a 2025-era session: the
caller identity a keyless call's derived key is bound to); the callers are the Python SDK's client
and the TypeScript SDK's (`tests/clients_real/ts_sdk_client.mjs`). What the upstream received
and did is read from its ledger (`calls`: each `tools/call` with its key, replays included;
`effects`), never from an answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from guarded_upstream import command as upstream_command
from held_cancels import GIVE_UP, HoldCancels
from mcp import MCPError
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import REQUEST_TIMEOUT, CallToolResult
from proxy_kit import MARKER, NodeServers, announced, http_url, meta_key, proxy_command, text

from idempotency import open_store, parse_history, wire

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

FRONTS = ["stdio", "http"]
#: The policy of every proxy here: `top_up` may run twice upstream (re-sent after a broken call).
POLICY = "[tools.top_up]\nupstream_idempotent = true\n"
#: Bounds a test's calls on a loaded 2-core machine (process start-ups included).
BOUND = 120.0
TS_CLIENT = Path(__file__).parents[1] / "clients_real" / "ts_sdk_client.mjs"
#: The TypeScript client's read timeout when it gives up on a held call: long enough for the call
#: to have reached the upstream (the test fails loudly if it did not), short for a test.
TS_GIVE_UP_MS = 5000
#: The TypeScript SDK's code for a request it gave up on (its `ErrorCode.RequestTimeout`).
TS_REQUEST_TIMEOUT = -32001


@dataclass
class Proxied:
    """A proxy in front of the guarded upstream: its store, and the upstream's ledger."""

    store: str
    ledger: Path
    #: The proxy's command line, without its front (`--listen` or not).
    options: list[str]

    def sent(self) -> list[str]:
        """The key of each `tools/call` the upstream received, in order."""
        return [json.loads(line)["key"] for line in _lines(self.ledger / "calls")]

    def effects(self) -> int:
        return len(_lines(self.ledger / "effects"))

    async def keys(self, *args: str) -> str:
        """`mcp-once keys ARGS --store STORE`'s output (it must exit 0)."""
        command = [sys.executable, "-m", "mcp_once", "keys", *args, "--store", self.store]
        with anyio.fail_after(BOUND):
            done = await anyio.run_process(command, check=False)
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode()

    async def settle_failed(self) -> None:
        """The operator's verdict on the one UNKNOWN record: failed, `--force`d (they know the
        upstream child is gone: it was SIGKILLed)."""
        (record,) = json.loads(await self.keys("list", "--state", "unknown", "--json"))
        await self.keys("settle", record["key"], "--failed", "--force")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def proxied(tmp_path: Path) -> Proxied:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    store = f"sqlite:///{tmp_path / 'proxy.sqlite3'}"
    upstream = upstream_command(tmp_path / "upstream.sqlite3", ledger)
    return Proxied(store, ledger, ["--store", store, "--policy", str(policy), "--", *upstream])


@asynccontextmanager
async def front(
    proxied: Proxied, kind: str, release: Callable[[], anyio.Event] | None = None
) -> AsyncIterator[Client]:
    """The proxy as a process with its stdio or `--listen` front, and a Python SDK client of it
    (holding its give-ups' cancels until `release()` is set, when given)."""
    with contextlib.ExitStack() as stack:
        transport: Any
        if kind == "stdio":
            command = proxy_command(*proxied.options)
            params = StdioServerParameters(
                command=command[0], args=command[1:], env=dict(os.environ)
            )
            transport, mode = stdio_client(params), "auto"
        else:
            command = proxy_command("--listen", "127.0.0.1:0", *proxied.options)
            line = stack.enter_context(announced(command, "mcp-once proxy at "))
            # A 2025-era session: the caller identity a keyless call's derived key is bound to.
            transport, mode = streamable_http_client(http_url(line)), "legacy"
        if release is not None:
            transport = HoldCancels(transport, release)
        async with Client(transport, mode=mode) as client:
            await client.list_tools()
            yield client


def marker(result: CallToolResult | dict[str, Any]) -> dict[str, Any]:
    meta = result.meta if isinstance(result, CallToolResult) else result.get("_meta")
    found = (meta or {}).get(MARKER)
    assert isinstance(found, dict), f"no marker in {meta!r}"
    return found


def upstream_replay(result: CallToolResult | dict[str, Any]) -> bool:
    """The answer is the upstream's replay, and says so."""
    seen = marker(result)
    return seen["status"] == "replayed" and seen.get(wire.MARKER_UPSTREAM) is True


def executed(result: CallToolResult | dict[str, Any]) -> bool:
    seen = marker(result)
    return seen["status"] == "executed" and wire.MARKER_UPSTREAM not in seen


# -- the Python SDK's client ----------------------------------------------------------------


@pytest.mark.parametrize("kind", FRONTS)
async def test_a_keyless_repeat_after_a_delivered_answer_runs_upstream_again(
    proxied: Proxied, kind: str
) -> None:
    """Two identical keyless calls, the first answer delivered: two intents, two upstream keys,
    two effects, both answers executed. Fails with the record's name as the upstream key: the
    upstream replays the second, and the proxy called that replay executed."""
    with anyio.fail_after(BOUND):
        async with front(proxied, kind) as client:
            first = await client.call_tool("charge", {"order": "r"})
            second = await client.call_tool("charge", {"order": "r"})
    assert (text(first), text(second)) == ("r: effect 1", "r: effect 2")
    assert executed(first) and executed(second)
    key, repeat = proxied.sent()
    assert key.startswith("mcp-once:") and repeat == f"{key}/2"
    assert proxied.effects() == 2


@pytest.mark.parametrize("kind", FRONTS)
async def test_a_keyless_resend_after_a_lost_answer_runs_upstream_once(
    proxied: Proxied, kind: str
) -> None:
    """The caller gives up on a keyless call (its read timeout's cancel, held until the upstream
    started the effect): its re-send is the same intent, answered by the proxy's record, and the
    upstream ran it once. The same call once more after that is a new intent: run upstream."""
    started = anyio.Event()
    held = {"order": "h", "hold": True}
    with anyio.fail_after(BOUND):
        async with front(proxied, kind, release=lambda: started) as client:
            async with anyio.create_task_group() as tg:

                async def give_up() -> None:
                    with pytest.raises(MCPError) as raised:
                        await client.session.call_tool("charge", held, read_timeout_seconds=GIVE_UP)
                    assert raised.value.error.code == REQUEST_TIMEOUT

                tg.start_soon(give_up)
                await client.call_tool("wait_started", {"count": 1})
                started.set()
            # The cancel was written before this: the proxy reads it before the gate opens.
            await client.call_tool("open_gate", {})
            resent = await client.call_tool("charge", held)
            effects_after_the_resend = proxied.effects()
            repeated = await client.call_tool("charge", held)
    assert effects_after_the_resend == 1
    assert text(resent) == "h: effect 1" and marker(resent)["status"] == "replayed"
    assert not upstream_replay(resent)  # the proxy's own replay: the upstream never saw it
    assert text(repeated) == "h: effect 2" and executed(repeated)
    key, repeat = proxied.sent()
    assert repeat == f"{key}/2" and proxied.effects() == 2


@pytest.mark.parametrize("kind", FRONTS)
async def test_the_same_meta_key_twice_runs_upstream_once(proxied: Proxied, kind: str) -> None:
    with anyio.fail_after(BOUND):
        async with front(proxied, kind) as client:
            first = await client.call_tool("charge", {"order": "m"}, meta=meta_key("m-1"))
            again = await client.call_tool("charge", {"order": "m"}, meta=meta_key("m-1"))
    assert executed(first) and marker(again)["status"] == "replayed"
    assert text(again) == text(first) == "m: effect 1"
    assert len(proxied.sent()) == 1 and proxied.effects() == 1


@pytest.mark.parametrize("kind", FRONTS)
async def test_a_resend_after_an_upstream_sigkill_reaches_it_under_the_same_key(
    proxied: Proxied, kind: str
) -> None:
    """`top_up` is `upstream_idempotent`: the upstream stores its result and is SIGKILLed before
    its answer; the proxy re-sends the call to a new child under the same key, which replays it.
    The caller gets that replay as one (`upstream: true`), the proxy's record keeps it so (its
    own replay says it too; its history's completed event says `upstream=replayed`), and the
    upstream ran the effect once. Fails when the proxy labels the upstream's replay executed."""
    call = {"order": "k", "crash_at": 1}
    with anyio.fail_after(BOUND):
        async with front(proxied, kind) as client:
            result = await client.call_tool("top_up", call, meta=meta_key("k-1"))
            again = await client.call_tool("top_up", call, meta=meta_key("k-1"))
    assert text(result) == text(again) == "k: effect 1"
    assert upstream_replay(result) and upstream_replay(again)
    first, resent = proxied.sent()
    assert first == resent and proxied.effects() == 1
    store = open_store(proxied.store)
    try:
        (record,) = await store.list_records()
        events = parse_history(await store.history(record.key))  # type: ignore[attr-defined]
    finally:
        await store.aclose()
    completed = [e.details for e in events if e.kind == "completed"]
    assert len(completed) == 1 and completed[0]["upstream"] == "replayed"


@pytest.mark.parametrize("kind", FRONTS)
async def test_settle_failed_then_a_retry_reaches_the_upstream_under_the_same_key(
    proxied: Proxied, kind: str
) -> None:
    """A keyless call, delivered; its repeat (intent 2) runs upstream, which stores it and is
    SIGKILLed before answering: -32012, the proxy's record UNKNOWN. The operator settles it
    `--failed` (`mcp-once keys settle`); the retry is the same intent, reaches the upstream under
    the repeat's key, and the upstream replays the repeat's effect: two effects in all, the
    retry's answer the upstream's replay. A key per execution would have charged a third time;
    the record's name as the key never reaches the repeat's effect at all."""
    call = {"order": "s", "crash_at": 2}
    with anyio.fail_after(BOUND):
        async with front(proxied, kind) as client:
            first = await client.call_tool("charge", call)
            with pytest.raises(MCPError) as raised:
                await client.call_tool("charge", call)
            assert raised.value.error.code == wire.OUTCOME_UNKNOWN
            await proxied.settle_failed()
            retried = await client.call_tool("charge", call)
    assert text(first) == "s: effect 1" and executed(first)
    assert text(retried) == "s: effect 2" and upstream_replay(retried)
    key, repeat, retry = proxied.sent()
    assert repeat == retry == f"{key}/2"
    assert proxied.effects() == 2


# -- the TypeScript SDK's client ------------------------------------------------------------


class TypeScriptClient:
    """`ts_sdk_client.mjs`: one TypeScript SDK client, driven a command at a time."""

    def __init__(self, process: Process) -> None:
        assert process.stdout is not None
        self.process = process
        self.lines = BufferedByteReceiveStream(process.stdout)

    async def __call__(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        await self.process.stdin.send(json.dumps(command).encode() + b"\n")
        answer: dict[str, Any] = json.loads(await self.lines.receive_until(b"\n", 1 << 22))
        return answer

    async def call(self, name: str, arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
        """The call's result (it must not be an error)."""
        answer = await self({"op": "call", "name": name, "arguments": arguments, **extra})
        assert "result" in answer, answer
        result: dict[str, Any] = answer["result"]
        return result

    async def error(self, name: str, arguments: dict[str, Any], **extra: Any) -> int:
        """The code of the error the call must end in."""
        answer = await self({"op": "call", "name": name, "arguments": arguments, **extra})
        assert "error" in answer, answer
        code: int = answer["error"]["code"]
        return code


@asynccontextmanager
async def typescript_client(
    node_servers: NodeServers, connect: dict[str, Any]
) -> AsyncIterator[TypeScriptClient]:
    command = [node_servers.node, str(TS_CLIENT), str(node_servers.prefix)]
    async with await anyio.open_process(command, stderr=None) as process:
        client = TypeScriptClient(process)
        assert "result" in await client({"op": "connect", **connect})
        try:
            yield client
        finally:
            assert process.stdin is not None
            await process.stdin.aclose()
            with anyio.fail_after(30):
                await process.wait()


def ts_text(result: dict[str, Any]) -> str:
    return str(result["content"][0]["text"])


@pytest.mark.parametrize("kind", FRONTS)
async def test_the_typescript_sdk_client_through_the_proxy(
    node_servers: NodeServers, proxied: Proxied, kind: str
) -> None:
    """The same cases with the TypeScript SDK's client, one session, counted at the upstream: a
    repeat after delivery runs twice; a re-send after the client gave up (its timeout's cancel)
    runs once; one `_meta` key twice runs once; an upstream SIGKILLed after storing, under
    `upstream_idempotent`, is re-sent under the same key and its replay says so; a retry after
    `keys settle --failed` reaches the upstream under the repeat's key."""
    with contextlib.ExitStack() as stack:
        if kind == "stdio":
            command = proxy_command(*proxied.options)
            connect: dict[str, Any] = {"command": command[0], "args": command[1:]}
        else:
            command = proxy_command("--listen", "127.0.0.1:0", *proxied.options)
            connect = {
                "url": http_url(stack.enter_context(announced(command, "mcp-once proxy at ")))
            }
        with anyio.fail_after(2 * BOUND):
            async with typescript_client(node_servers, connect) as ts:
                # A repeat after a delivered answer: two intents, two effects.
                repeated = [await ts.call("charge", {"order": "r"}) for _ in range(2)]
                assert [ts_text(r) for r in repeated] == ["r: effect 1", "r: effect 2"]
                assert all(executed(r) for r in repeated)
                # A re-send after the client gave up on a held call: one effect.
                held = {"order": "h", "hold": True}
                code = await ts.error("charge", held, timeoutMs=TS_GIVE_UP_MS)
                assert code == TS_REQUEST_TIMEOUT
                await ts.call("wait_started", {"count": 3})  # the held call reached the upstream
                await ts.call("open_gate", {})
                resent = await ts.call("charge", held)
                assert ts_text(resent) == "h: effect 1" and marker(resent)["status"] == "replayed"
                again = await ts.call("charge", held)
                assert ts_text(again) == "h: effect 2" and executed(again)
                # One `_meta` key twice: one effect.
                keyed = [
                    await ts.call("charge", {"order": "m"}, meta=meta_key("m-1")) for _ in range(2)
                ]
                assert [marker(r)["status"] for r in keyed] == ["executed", "replayed"]
                # The upstream SIGKILLed after storing: re-sent under the same key, replayed.
                killed = await ts.call("top_up", {"order": "k", "crash_at": 1})
                assert ts_text(killed) == "k: effect 1" and upstream_replay(killed)
                # settle --failed, then the retry under the repeat's key.
                settled = {"order": "s", "crash_at": 2}
                assert executed(await ts.call("charge", settled))
                assert await ts.error("charge", settled) == wire.OUTCOME_UNKNOWN
                await proxied.settle_failed()
                retried = await ts.call("charge", settled)
                assert ts_text(retried) == "s: effect 2" and upstream_replay(retried)
    sent = proxied.sent()
    r1, r2, h1, h2, m1, k1, k2, s1, s2, s3 = sent
    assert r2 == f"{r1}/2" and h2 == f"{h1}/2" and k1 == k2
    assert s2 == s3 == f"{s1}/2" and len({r1, h1, m1, k1, s1}) == 5
    # r 2, h 2, m 1, k 1, s 2: every effect the callers meant, none twice.
    assert proxied.effects() == 8
