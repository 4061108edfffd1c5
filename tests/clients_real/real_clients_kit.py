"""What every real-client test shares: the servers under test, the ledger, and the legs.

A *leg* is one thing issue 24 says must be shown ("the same call twice with the same argument
key: 1 effect, the second answer marked replayed"), written once here against the `Caller`
protocol; each client module adapts its client to `Caller` and runs the legs its client can do.
Effects are read from the ledger the tool bodies write (a SQLite file in the test's temporary
folder), "nothing written" from the key store's own file; neither is the server's word.

Every leg uses fresh order ids and keys, so one server (one store, one ledger) serves them all
and the legs of one setting can run one after another in one client session.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import anyio
import httpx2
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from idempotency import SQLiteKeyStore, wire

HERE = Path(__file__).resolve().parent
SERVER_SCRIPT = HERE / "real_client_server.py"
FLAVORS = ["mcpserver", "fastmcp"]
KEY_ARGUMENT = "idempotency_key"
NESTED = ("meta", "idempotency-key")
HEADER = "Idempotency-Key"
INSPECTOR_ENTRY = Path("@modelcontextprotocol/inspector/clients/launcher/build/index.js")
#: Bounds one leg on a loaded 2-core machine; a hang fails the leg instead of the whole run.
LEG_TIMEOUT = 60.0


@dataclass(frozen=True)
class NodeClients:
    """Where the npm clients are: the install folder, the machine's node, and the node and
    entry script that run the Inspector."""

    prefix: Path
    node: str
    inspector_node: str

    @property
    def inspector(self) -> list[str]:
        return [self.inspector_node, str(self.prefix / "node_modules" / INSPECTOR_ENTRY)]


@dataclass(frozen=True)
class Outcome:
    """What a client reported for one tools/call: the result as JSON, or an error.

    `code` is the JSON-RPC error code where the client shows it (the Inspector CLI prints only
    the message); `message` is the error's text."""

    result: Mapping[str, Any] | None = None
    code: int | None = None
    message: str = ""

    @property
    def marker(self) -> Mapping[str, Any] | None:
        """The result's `io.github.mcp-once/idempotency` entry (None when the call was not
        guarded, or failed)."""
        found = ((self.result or {}).get("_meta") or {}).get(wire.IDEMPOTENCY_META)
        return found if isinstance(found, dict) else None

    @property
    def status(self) -> object:
        return (self.marker or {}).get("status")

    @property
    def text(self) -> str:
        assert self.result is not None, f"the call failed: {self.code} {self.message}"
        first = self.result["content"][0]
        return str(first["text"])


@dataclass(frozen=True)
class Call:
    """One tools/call as a leg asks for it; `header` is the `Idempotency-Key` header's value
    (HTTP only), None for no header."""

    tool: str
    arguments: dict[str, Any]
    meta: dict[str, Any] | None = None
    header: str | None = None


class Caller(ABC):
    """One client, connected to one server, as the legs use it: each client module says how
    its client sends a `Call` (`send`)."""

    #: Whether the client shows an error's JSON-RPC code (else only its message).
    shows_codes = True

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        meta: dict[str, Any] | None = None,
        header: str | None = None,
    ) -> Outcome:
        return await self.send(Call(tool, arguments, meta, header))

    @abstractmethod
    async def send(self, call: Call) -> Outcome: ...


@dataclass
class Served:
    """One server flavor's files (key store, ledger), and its URL when it serves HTTP."""

    flavor: str
    store: Path
    ledger: Path
    url: str | None = None

    def stdio_command(self) -> list[str]:
        """The command line that starts this server over stdio (a new process each time)."""
        return [
            sys.executable,
            str(SERVER_SCRIPT),
            "--flavor",
            self.flavor,
            "--store",
            str(self.store),
            "--ledger",
            str(self.ledger),
        ]

    def effects(self, order: str) -> int:
        """How many times the effect of `order` happened, by the ledger."""
        if not self.ledger.exists():
            return 0
        with sqlite3.connect(self.ledger, timeout=30) as db:
            (count,) = db.execute(
                "SELECT COUNT(*) FROM effects WHERE order_id = ?", (order,)
            ).fetchone()
        return int(count)

    async def records(self) -> int:
        """How many records the key store holds (what a refused call must not add to)."""
        if not self.store.exists():
            return 0
        store = SQLiteKeyStore(str(self.store))
        try:
            return len(await store.list_records())
        finally:
            await store.aclose()


def served_in(request: pytest.FixtureRequest, flavor: str, *, http: bool) -> Served:
    """The session's `flavor` server: its files (for stdio clients, which start it themselves)
    or, with `http`, its running HTTP server (started on first use)."""
    servers: dict[str, Served] = request.getfixturevalue("http_servers" if http else "served_files")
    return servers[flavor]


@contextmanager
def http_server(served: Served) -> Iterator[Served]:
    """Start `served`'s server over streamable HTTP in a process of its own; stop it after."""
    process = subprocess.Popen(
        [*served.stdio_command(), "--http"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # the socket listens once this is printed
        if not line.startswith("listening on "):
            raise RuntimeError(f"{served.flavor} server did not start: {_rest(process.stderr)}")
        served.url = line.removeprefix("listening on ").strip()
        yield served
    finally:
        _stop(process)


def _rest(stream: IO[str] | None) -> str:
    return stream.read() if stream is not None else ""


def _stop(process: subprocess.Popen[str]) -> None:
    """Closing stdin asks the server to stop; it is killed if it does not within 10 s."""
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


#: How the Python clients reach a server: a stdio subprocess, or streamable HTTP in the
#: 2025-11-25 era (`legacy`) or the newest the server speaks (`auto`: 2026-07-28 here).
PYTHON_SETTINGS = ["stdio", "http-legacy", "http-modern"]


@asynccontextmanager
async def python_client(
    served: Served, setting: str
) -> AsyncIterator[tuple[Client, httpx2.AsyncClient | None]]:
    """An `mcp.Client` connected to `served` in `setting`, and over HTTP its HTTP client, whose
    headers a caller may change between calls."""
    if setting == "stdio":
        program, *args = served.stdio_command()
        async with Client(StdioServerParameters(command=program, args=args)) as client:
            yield client, None
        return
    assert served.url is not None
    mode = "auto" if setting == "http-modern" else "legacy"
    async with (
        httpx2.AsyncClient(timeout=30) as http,
        Client(streamable_http_client(served.url, http_client=http), mode=mode) as client,
    ):
        yield client, http


def set_header(http: httpx2.AsyncClient | None, header: str | None) -> None:
    """Send `header` as the `Idempotency-Key` of the calls that follow (None: no header)."""
    if header is not None:
        assert http is not None, "headers travel only over HTTP"
        http.headers[HEADER] = header
    elif http is not None:
        http.headers.pop(HEADER, None)


def outcome_of(result: CallToolResult) -> Outcome:
    return Outcome(result=result.model_dump(by_alias=True, mode="json", exclude_none=True))


def refusal(error: MCPError) -> Outcome:
    return Outcome(code=error.code, message=error.message)


def fresh(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:10]}"


def charge(order: str, key: object = None) -> dict[str, Any]:
    """`charge`'s arguments, with `key` in `idempotency_key` unless None."""
    arguments: dict[str, Any] = {"order": order, "cents": 5}
    if key is not None:
        arguments[KEY_ARGUMENT] = key
    return arguments


def meta_key(key: str) -> dict[str, Any]:
    return {wire.KEY_META: key}


def invalid_params(caller: Caller, outcome: Outcome, *phrases: str) -> None:
    """`outcome` is the -32602 refusal (where the client shows codes) naming `phrases`."""
    assert outcome.result is None, f"expected a refusal, got {outcome.result}"
    if caller.shows_codes:
        assert outcome.code == wire.INVALID_PARAMS, outcome
    for phrase in phrases:
        assert phrase in outcome.message, (phrase, outcome.message)


# --- the legs --------------------------------------------------------------------------------

Leg = Callable[[Caller, Served], Awaitable[None]]
#: Legs that compare the store's whole record count before and after a refused call: they run
#: alone, after the others, so that no other leg's record lands in between.
STORE_WIDE: set[str] = set()


def store_wide(leg: Leg) -> Leg:
    STORE_WIDE.add(leg.__name__)
    return leg


async def nothing_written(served: Served, before: int, order: str) -> None:
    assert served.effects(order) == 0, f"{order} ran"
    after = await served.records()
    assert after == before, f"the store holds {after} records, {before} before the refusal"


async def same_argument_key_twice(caller: Caller, served: Served) -> None:
    """The same call sent twice with the same argument key: 1 effect, the second replayed."""
    order, key = fresh("same"), fresh("k")
    first = await caller.call("charge", charge(order, key))
    again = await caller.call("charge", charge(order, key))
    assert (ran := served.effects(order)) == 1, f"{ran} effects, expected 1"
    assert first.status == "executed" and again.status == "replayed", (first, again)
    assert again.text == first.text
    assert again.marker is not None and again.marker["key"] == key
    assert again.marker["keySource"] == "client"


async def new_argument_key(caller: Caller, served: Served) -> None:
    """The same call with a new key is a new action: 2 effects, both executed."""
    order = fresh("new")
    first = await caller.call("charge", charge(order, fresh("k")))
    second = await caller.call("charge", charge(order, fresh("k")))
    assert (ran := served.effects(order)) == 2, f"{ran} effects, expected 2"
    assert first.status == second.status == "executed", (first, second)


async def no_key_runs_twice(caller: Caller, served: Served) -> None:
    """The control: no key anywhere, the call runs twice (the ledger does see duplicates), and
    the answers are the host's own (no marker: the guard passed the call through)."""
    order = fresh("nokey")
    first = await caller.call("charge", charge(order))
    second = await caller.call("charge", charge(order))
    assert (ran := served.effects(order)) == 2, f"{ran} effects, expected 2"
    assert first.marker is None and second.marker is None, (first, second)
    assert first.text != second.text


async def nested_argument_key_twice(caller: Caller, served: Served) -> None:
    """The key in a nested argument (`meta.idempotency-key`): 1 effect, the second replayed."""
    order, key = fresh("nested"), fresh("k")
    arguments = {"order": order, "cents": 5, NESTED[0]: {NESTED[1]: key}}
    first = await caller.call("charge_nested", arguments)
    again = await caller.call("charge_nested", arguments)
    assert (ran := served.effects(order)) == 1, f"{ran} effects, expected 1"
    assert first.status == "executed" and again.status == "replayed", (first, again)


@store_wide
async def meta_and_argument_disagree(caller: Caller, served: Served) -> None:
    """`_meta` and argument keys that differ: -32602 naming both places, nothing run."""
    order = fresh("conflict")
    before = await served.records()
    refused = await caller.call("charge", charge(order, fresh("a")), meta=meta_key(fresh("b")))
    invalid_params(caller, refused, wire.KEY_META, f"argument '{KEY_ARGUMENT}'", "Nothing was run")
    await nothing_written(served, before, order)


async def meta_and_argument_agree(caller: Caller, served: Served) -> None:
    """`_meta` and argument keys that are equal are one key: the argument-only retry replays."""
    order, key = fresh("agree"), fresh("k")
    first = await caller.call("charge", charge(order, key), meta=meta_key(key))
    again = await caller.call("charge", charge(order, key))
    assert (ran := served.effects(order)) == 1, f"{ran} effects, expected 1"
    assert first.status == "executed" and again.status == "replayed", (first, again)


async def header_dedupes_a_keyless_body(caller: Caller, served: Served) -> None:
    """The `Idempotency-Key` header on a keyless body: 1 effect, the second replayed; another
    header value is another action."""
    order, key = fresh("header"), fresh("h")
    first = await caller.call("charge", charge(order), header=key)
    again = await caller.call("charge", charge(order), header=key)
    other = await caller.call("charge", charge(order), header=fresh("h"))
    assert (ran := served.effects(order)) == 2, f"{ran} effects, expected 2"
    assert (first.status, again.status, other.status) == ("executed", "replayed", "executed")
    assert again.marker is not None and again.marker["key"] == key


async def header_ignored_when_off(caller: Caller, served: Served) -> None:
    """A tool whose server did not opt in (`key_header` unset) ignores the header: it is not a
    key, the keyless call runs each time (2 effects), as documented."""
    order, key = fresh("off"), fresh("h")
    first = await caller.call("charge_headerless", charge(order), header=key)
    second = await caller.call("charge_headerless", charge(order), header=key)
    assert (ran := served.effects(order)) == 2, f"{ran} effects, expected 2"
    assert first.marker is None and second.marker is None, (first, second)


@store_wide
async def header_and_argument_disagree(caller: Caller, served: Served) -> None:
    """Header and argument keys that differ: -32602 naming both places, nothing run."""
    order = fresh("hconflict")
    before = await served.records()
    refused = await caller.call("charge", charge(order, fresh("a")), header=fresh("h"))
    invalid_params(caller, refused, f"argument '{KEY_ARGUMENT}'", f"HTTP header '{HEADER}'")
    await nothing_written(served, before, order)


def bad_header(value: str, reason: str) -> Leg:
    """A bad header value (as the client can send it): -32602 naming the header, nothing run."""

    async def leg(caller: Caller, served: Served) -> None:
        order = fresh("badheader")
        before = await served.records()
        refused = await caller.call("charge", charge(order), header=value)
        invalid_params(caller, refused, f"HTTP header '{HEADER}'", reason)
        await nothing_written(served, before, order)

    leg.__name__ = f"bad_header[{reason}]"
    return store_wide(leg)


def bad_argument(value: object, reason: str) -> Leg:
    """A bad argument key: -32602 naming the argument, nothing run."""

    async def leg(caller: Caller, served: Served) -> None:
        order = fresh("badarg")
        before = await served.records()
        refused = await caller.call("charge", charge(order, value))
        invalid_params(caller, refused, f"argument '{KEY_ARGUMENT}'", reason)
        await nothing_written(served, before, order)

    leg.__name__ = f"bad_argument[{reason}]"
    return store_wide(leg)


#: The key in an argument: replay, a new key, and the keyless control.
KEY_LEGS: list[Leg] = [same_argument_key_twice, new_argument_key, no_key_runs_twice]
#: Bad argument keys (the server checks them the same way whatever the client).
BAD_ARGUMENT_LEGS: list[Leg] = [
    bad_argument("", "must not be empty"),
    bad_argument("k" * 256, "at most 255"),
    bad_argument(7, "must be a string"),
    bad_argument("a\u0007b", "printable ASCII"),
]
#: The legs every client that sends arguments can run, on any transport.
ARGUMENT_LEGS: list[Leg] = [*KEY_LEGS, nested_argument_key_twice, *BAD_ARGUMENT_LEGS]
#: The legs of a client that can also write request `_meta`.
META_LEGS: list[Leg] = [meta_and_argument_disagree, meta_and_argument_agree]
#: The legs of a client that can set request headers (streamable HTTP only). A header value
#: cannot carry most control characters at all (HTTP clients refuse them); a tab inside the
#: value is the one they send.
HEADER_LEGS: list[Leg] = [
    header_dedupes_a_keyless_body,
    header_ignored_when_off,
    header_and_argument_disagree,
    bad_header("k" * 256, "at most 255"),
    bad_header("a\tb", "printable ASCII"),
]
EMPTY_HEADER_LEG = bad_header("", "must not be empty")


@dataclass
class LegFailures:
    """Runs legs one after another in one client session, and reports every failing leg (not
    only the first) with its name."""

    failures: list[str] = field(default_factory=list)

    async def run(
        self,
        legs: Sequence[Callable[[Any, Served], Awaitable[None]]],
        caller: Caller,
        served: Served,
        *,
        concurrency: int = 1,
    ) -> None:
        """Run `legs`, up to `concurrency` at a time (legs share nothing but the server: a
        client that starts a process per call gains from overlapping them); then the
        store-wide legs, one at a time."""
        limiter = anyio.CapacityLimiter(concurrency)

        async def one(leg: Callable[[Any, Served], Awaitable[None]]) -> None:
            async with limiter:
                try:
                    with anyio.fail_after(LEG_TIMEOUT):
                        await leg(caller, served)
                except (AssertionError, TimeoutError) as exc:
                    self.failures.append(f"{leg.__name__}: {type(exc).__name__}: {exc}")

        async with anyio.create_task_group() as tg:
            for leg in legs:
                if leg.__name__ not in STORE_WIDE:
                    tg.start_soon(one, leg)
        limiter.total_tokens = 1
        for leg in legs:
            if leg.__name__ in STORE_WIDE:
                await one(leg)

    def check(self) -> None:
        assert not self.failures, "failing legs:\n" + "\n".join(self.failures)


async def check_legs(
    legs: Sequence[Callable[[Any, Served], Awaitable[None]]],
    caller: Caller,
    served: Served,
    *,
    concurrency: int = 1,
) -> None:
    """Run `legs` (see `LegFailures.run`) and fail naming every leg that failed."""
    failures = LegFailures()
    await failures.run(legs, caller, served, concurrency=concurrency)
    failures.check()
