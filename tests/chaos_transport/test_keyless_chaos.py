"""The chaos suite with keyless clients (issue 33, rule 15): 0 duplicate effects.

A blind keyless re-sender, like the agent frameworks the docs list (pydantic-ai's `ModelRetry`,
the OpenAI Agents SDK's `max_retry_attempts`), calls `pay(order)` with no key: on a timeout it
sends the identical call again on the same connection (the SDK has sent `notifications/cancelled`
for the request it gave up on), on a dead link it opens a new connection with the same bearer
token and sends it again. A seeded chaos plan loses answers, dispatches requests twice, delays
them past the timeout and breaks streams. The server is an `MCPServer` guarded by
`idempotency.install` with default options, so every keyless call gets a derived key; the effect
is counted in a ledger outside the answers. Each run is repeated with the same seed and plan
against the same server without the guard, where the same faults show duplicate effects.

Four combinations still take effect twice under the guard; each is pinned down by a strict
xfail below, with its message order and guard path:
- a re-send that is itself dispatched twice, after a lost answer (a replay consumes the
  undelivered mark at once, so its twin is taken for a deliberate repeat);
- a call dispatched twice whose copy reaches the server only after the first was answered (a
  copy read while the first ran is merged, however late its claim: its own test);
- a broken stream whose answer the server wrote before the client tore the connection down
  (the server saw the answer delivered, and a re-send on a new connection is a repeat);
- a lost answer over 2026-07-28 streamable HTTP (no give-up ever reaches the server).
The seeded runs therefore double-dispatch and break the streams of first sends only
(`BreakFirstSends`), answer a twinned call only once both copies have claimed its record and
never time it out (so no load can move a copy past the answer, nor make a twin's swallowed
answer stand for a lost one: `Shop`, `hold_the_clock`), give the tool time enough for a broken
stream's teardown to reach the server while it runs, and run 2026 HTTP without lost answers.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    asynccontextmanager,
    contextmanager,
)
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import httpx2
import pytest
from chaos_helpers import MODE, serve_in_thread, text
from mcp import MCPError
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import CallNext, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared import _request_clock
from mcp.shared.message import SessionMessage
from mcp_types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    CallToolResult,
    JSONRPCRequest,
    ToolAnnotations,
)

from idempotency import ClaimOutcome, MemoryKeyStore, current_claim, install, wire
from orchestrator.chaos import Chaos, Fault, FaultPlan
from orchestrator.chaos._memory import in_memory_transport

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]

#: Per-attempt read timeout of the re-sender in process, and behind HTTP; delays are drawn
#: past it.
TIMEOUT = 0.25
HTTP_TIMEOUT = 0.4
#: Attempts per logical call before the re-sender gives up on it.
ATTEMPTS = 6
#: Logical calls (distinct orders) per run.
ORDERS = 16
#: Generous bound on one run (or one scripted case) on a loaded 2-core machine.
BOUND = 120.0
#: How long `pay` works in process: it yields, so a twin dispatched with it finds it in flight.
WORK = 0.01
#: How long `pay` works behind HTTP (a payment provider's round trip): long enough for the
#: teardown of a broken stream to reach the server while it runs, and for a twin POST to find it
#: in flight. `test_a_broken_stream_whose_answer_was_written_runs_again` shows the other order.
HTTP_WORK = 0.1
SEED = 33


class Shop:
    """`pay(order)` and its effect ledger, counted outside the answers.

    Under the guard, in a chaos run (`chaos`), a request the link dispatches twice does not
    answer before both copies have claimed its record: the second then finds the first in
    flight, as rule 15 merges it, however late the server gets to it (the seeded runs stay out
    of the window `test_a_twin_received_after_its_original_was_answered_runs_again` shows)."""

    def __init__(
        self,
        *,
        guarded: bool,
        auth: bool = False,
        work: float = WORK,
        middleware: list[Any] | None = None,
    ) -> None:
        self.guarded = guarded
        self.auth = auth
        self.work = work
        self.middleware = middleware
        self.effects: Counter[str] = Counter()
        self.first: dict[str, str] = {}
        self.executions = 0
        #: Set (from the server's thread, where it runs) once a result is stored.
        self.stored = threading.Event()
        self.store: SignallingStore | None = None
        self.chaos: Chaos | None = None

    def twinned(self, request_id: object) -> bool:
        """Whether the chaos link dispatches this request twice (its copy carries a string id;
        the client numbers its own requests)."""
        assert self.chaos is not None
        return isinstance(request_id, str) or any(
            fault.kind is Fault.DUPLICATE and fault.request_id == request_id
            for fault in self.chaos.faults
        )

    def server(self) -> MCPServer:
        kwargs: dict[str, Any] = {"middleware": self.middleware}
        if self.auth:
            kwargs |= {
                "auth": AuthSettings(issuer_url="http://127.0.0.1", resource_server_url=None),
                "token_verifier": Tokens(),
            }
        server = MCPServer("keyless-shop", **kwargs)

        @server.tool()
        async def pay(order: str, ctx: Context) -> str:
            if (
                self.store is not None
                and self.chaos is not None
                and self.twinned(ctx.request_context.request_id)
            ):
                claim = current_claim()
                assert claim is not None
                await self.store.claimed_twice(claim.record)
            await anyio.sleep(self.work)
            self.executions += 1
            self.effects[order] += 1
            answer = f"paid {order} (execution {self.executions})"
            self.first.setdefault(order, answer)
            return answer

        @server.tool(annotations=ToolAnnotations(read_only_hint=True))
        async def ping() -> str:  # read-only: the guard passes it through, no record
            return "pong"

        if self.guarded:
            self.store = SignallingStore(self.stored)
            install(server, self.store)
        return server


class SignallingStore(MemoryKeyStore):
    """A memory store that says when a result is stored, and when a record was claimed twice
    (a test's synchronisation, no sleep)."""

    def __init__(self, stored: threading.Event) -> None:
        super().__init__()
        self._stored = stored
        self.claims: Counter[str] = Counter()
        self._twice: dict[str, anyio.Event] = {}

    async def claim(self, key: str, *args: Any, **kwargs: Any) -> ClaimOutcome:
        outcome: ClaimOutcome = await super().claim(key, *args, **kwargs)
        self.claims[key] += 1
        if self.claims[key] >= 2 and key in self._twice:
            self._twice.pop(key).set()
        return outcome

    async def claimed_twice(self, key: str) -> None:
        """Return once `key` has been claimed twice (in the loop the server runs in)."""
        if self.claims[key] < 2:
            await self._twice.setdefault(key, anyio.Event()).wait()

    async def complete(self, *args: Any, **kwargs: Any) -> bool:
        done = bool(await super().complete(*args, **kwargs))
        self._stored.set()
        return done


class Tokens:
    """`Bearer user-<name>` authenticates client `<name>`."""

    async def verify_token(self, token: str) -> AccessToken | None:
        if not token.startswith("user-"):
            return None
        return AccessToken(token=token, client_id=token.removeprefix("user-"), scopes=[])


def status(result: CallToolResult) -> str | None:
    found = (result.meta or {}).get(wire.IDEMPOTENCY_META)
    return found.get("status") if isinstance(found, dict) else None


Connect = Callable[[Chaos, str], AbstractAsyncContextManager[Client]]


@dataclass
class Tally:
    """What the re-sender saw."""

    answers: dict[str, CallToolResult] = field(default_factory=dict)
    timeouts: int = 0
    reconnects: int = 0
    unanswered: list[str] = field(default_factory=list)
    #: (order, the request's ordinal in the chaos run, what the attempt got)
    attempts: list[tuple[str, int, str]] = field(default_factory=list)


class Resender:
    """A blind keyless re-sender over one chaos run: a timeout re-sends on the same connection,
    a dead link is closed and the call re-sent on a new one (same bearer token).

    `before_reconnect` runs once the dead link is noticed, before it is closed (a scripted case
    uses it to order the teardown after the server's answer)."""

    def __init__(
        self,
        chaos: Chaos,
        connect: Connect,
        mode: str,
        timeout: float = TIMEOUT,
        before_reconnect: Callable[[], Any] | None = None,
    ) -> None:
        self._chaos = chaos
        self._connect = connect
        self._mode = mode
        self._timeout = timeout
        self._before_reconnect = before_reconnect
        self._stack: AsyncExitStack | None = None
        self._client: Client | None = None
        self.tally = Tally()

    async def _open(self) -> Client:
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(self._connect(self._chaos, self._mode))
            # Listed up front so call_tool's output validation sends no tools/list mid-call;
            # a warm-up call (never faulted: the plans break `pay` only), as first calls are
            # slow, so that only injected faults time a call out.
            await client.list_tools()
            await client.call_tool("ping", {})
            self._stack, self._client = stack.pop_all(), client
        return client

    async def _close(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def pay(self, order: str) -> CallToolResult | None:
        for attempt in range(ATTEMPTS):
            client = self._client if self._client is not None else await self._open()
            plan = self._chaos.plan
            if isinstance(plan, BreakFirstSends):
                plan.resending[0] = attempt > 0
            try:
                result = await client.call_tool(
                    "pay", {"order": order}, read_timeout_seconds=self._timeout
                )
            except MCPError as exc:
                self.tally.attempts.append((order, self._chaos.requests_seen, str(exc.code)))
                if exc.code == REQUEST_TIMEOUT:
                    self.tally.timeouts += 1
                    continue
                if exc.code == CONNECTION_CLOSED:
                    self.tally.reconnects += 1
                    if self._before_reconnect is not None:
                        await self._before_reconnect()
                    await self._close()
                    continue
                raise
            self.tally.attempts.append((order, self._chaos.requests_seen, str(status(result))))
            self.tally.answers[order] = result
            return result
        self.tally.unanswered.append(order)
        return None

    async def run(self, orders: list[str]) -> Tally:
        try:
            for order in orders:
                await self.pay(order)
            # Every answer the chaos swallowed came back before the link goes: the ledger is
            # final (a connection closed earlier would cut a twin short).
            await self._chaos.settled()
        finally:
            await self._close()
        return self.tally


def memory_connect(shop: Shop) -> Connect:
    """Connections to one in-process server over the chaos link's memory wire (the caller is the
    connection: no authentication in process)."""
    server = shop.server()

    def connect(chaos: Chaos, mode: str) -> Client:
        return Client(chaos.wrap(server), mode=mode)

    return connect


@contextmanager
def http_shop(shop: Shop) -> Iterator[str]:
    """`shop` over stateful streamable HTTP on 127.0.0.1, with bearer authentication, served by
    uvicorn in its own thread (its own asyncio loop: a trio client can talk to it too)."""
    # A factory: the server, its store and the app are built in the server's own loop.
    with serve_in_thread(lambda: shop.server().streamable_http_app()) as url:
        yield url


def http_connect(url: str, user: str = "ann") -> Connect:
    """Connections as `user` (one principal: a re-send on a new connection is the same caller)."""

    @asynccontextmanager
    async def connect(chaos: Chaos, mode: str) -> AsyncIterator[Client]:
        headers = {"Authorization": f"Bearer user-{user}"}
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(chaos.wrap(streamable_http_client(url, http_client=http)), mode=mode) as client,
        ):
            yield client

    return connect


@dataclass
class Run:
    shop: Shop
    chaos: Chaos
    tally: Tally

    @property
    def effects(self) -> int:
        return sum(self.shop.effects.values())

    @property
    def duplicates(self) -> int:
        return sum(count - 1 for count in self.shop.effects.values() if count > 1)

    def figures(self) -> str:
        counts = {kind.value: n for kind, n in self.chaos.fault_counts().items() if n}
        twice = {order: n for order, n in self.shop.effects.items() if n > 1}
        faults = {record.index: record.kind.value for record in self.chaos.faults}
        walk = " ".join(
            f"{order.removeprefix('order-')}#{index}:{faults.get(index, '-')}>{got}"
            for order, index, got in self.tally.attempts
        )
        return (
            f"guard={self.shop.guarded} seed={self.chaos.seed} requests={self.chaos.requests_seen}"
            f" connections={self.chaos.connections} faults={counts}"
            f" timeouts={self.tally.timeouts} reconnects={self.tally.reconnects}"
            f" answered={len(self.tally.answers)} unanswered={len(self.tally.unanswered)}"
            f" effects={self.effects} duplicates={self.duplicates} {twice=} | {walk}"
        )


async def run_chaos(
    shop: Shop, connect: Connect, plan: FaultPlan, mode: str, timeout: float = TIMEOUT
) -> Run:
    chaos = shop.chaos = Chaos(plan, seed=SEED)
    orders = [f"order-{n}" for n in range(ORDERS)]
    with anyio.fail_after(BOUND):
        tally = await Resender(chaos, connect, mode, timeout).run(orders)
    run = Run(shop, chaos, tally)
    print(run.figures())  # the figures of the run, shown with -s or on failure
    return run


def assert_once(run: Run) -> None:
    """Every answered order took effect exactly once and none more than once, and each
    caller's final answer is its order's first (and only) execution."""
    shop, tally = run.shop, run.tally
    assert run.duplicates == 0, run.figures()
    assert all(count <= 1 for count in shop.effects.values()), run.figures()
    for order, result in tally.answers.items():
        assert shop.effects[order] == 1, (order, run.figures())
        assert text(result) == shop.first[order], (order, run.figures())
        assert status(result) in {"executed", "replayed"}
    assert tally.answers, run.figures()


def assert_contrast(run: Run, bare: Run) -> None:
    """The same seed and plan without the guard: duplicate effects."""
    assert (bare.chaos.seed, bare.chaos.plan) == (run.chaos.seed, run.chaos.plan)
    assert bare.duplicates > 0, bare.figures()


#: What strikes first sends only: a re-send answered from the record (a replay) is handed out
#: at once, so its twin, or a teardown after it, comes after the answer (see the xfails).
FIRST_SENDS_ONLY = frozenset({Fault.DUPLICATE, Fault.CLOSE_AFTER_WRITE})


def hold_the_clock() -> None:
    """Stop the timeout of the request being written, for good.

    A twinned send that times out (a loaded machine can stretch a clean call past `TIMEOUT`)
    sends a cancel the guard does not take as a give-up: the twin on the same connection was
    handed the answer (`received_elsewhere`), which a client that dispatches twice receives,
    but the link swallows it. Its re-send then runs again, a window rule 15 accepts (a twin's
    answer handed out is an answer delivered) and the seeded runs stay out of: the link
    decides a request's fault as the client writes it, in the writer's context, where the SDK
    keeps that request's clock (a private ContextVar of `mcp.shared._request_clock`; the
    clock is off during the write, and one more pause keeps it off)."""
    clock = _request_clock._clock.get()
    assert clock is not None, "the SDK keeps no request clock where the link decides faults"
    clock.pause()


@dataclass(frozen=True)
class BreakFirstSends(FaultPlan):
    """A plan whose DUPLICATE and CLOSE_AFTER_WRITE draws pass clean on re-sends: a twinned
    re-send, and a re-send whose stream breaks after its replay was handed out, are the cases
    rule 15 does not merge, shown on their own by the xfails below. The re-sender says which
    send is a re-send (`resending`) before it writes it; every draw stays where it was, and a
    re-send can still lose its answer, be delayed or be dropped. A twinned send's timeout is
    stopped (`hold_the_clock`)."""

    resending: list[bool] = field(default_factory=lambda: [False], compare=False)

    __hash__ = FaultPlan.__hash__

    def choose(self, index: int, draw: float) -> Fault | None:
        kind = super().choose(index, draw)
        if kind in FIRST_SENDS_ONLY and self.resending[0]:
            return None
        if kind is Fault.DUPLICATE:
            hold_the_clock()  # a twinned send is never given up on
        return kind


def past(timeout: float) -> dict[str, float]:
    """Delays past the re-sender's timeout (the delayed request's re-send, queued behind it,
    still makes its own)."""
    return {"delay_min_seconds": timeout + 0.1, "delay_max_seconds": timeout + 0.15}


#: Lost answers, double dispatch, requests and answers delayed past the timeout, drops.
MEMORY_PLAN = BreakFirstSends(
    lost_ack=0.15,
    duplicate=0.15,
    delay_request=0.1,
    delay_response=0.1,
    drop_request=0.05,
    tools={"pay"},
    **past(TIMEOUT),
)

#: Over HTTP, broken streams too (and a reconnection after each).
HTTP_PLAN = BreakFirstSends(
    lost_ack=0.15,
    duplicate=0.1,
    delay_response=0.1,
    close_after_write=0.15,
    tools={"pay"},
    **past(HTTP_TIMEOUT),
)

#: 2026-07-28 HTTP: only what reaches the server as a give-up (see the lost-answer xfail).
MODERN_HTTP_PLAN = BreakFirstSends(
    duplicate=0.15, close_after_write=0.2, tools={"pay"}, **past(HTTP_TIMEOUT)
)

BACKENDS = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
ERAS = pytest.mark.parametrize("era", ["modern", "legacy"])


@BACKENDS
@ERAS
async def test_keyless_resends_over_a_faulty_memory_link_take_effect_once(era: str) -> None:
    shop = Shop(guarded=True)
    run = await run_chaos(shop, memory_connect(shop), MEMORY_PLAN, MODE[era])
    bare_shop = Shop(guarded=False)
    bare = await run_chaos(bare_shop, memory_connect(bare_shop), MEMORY_PLAN, MODE[era])
    assert_once(run)
    assert run.chaos.fault_counts()[Fault.LOST_ACK] and run.chaos.fault_counts()[Fault.DUPLICATE]
    assert {"replayed"} <= {status(answer) for answer in run.tally.answers.values()}
    assert_contrast(run, bare)


@BACKENDS
@pytest.mark.parametrize(
    ("http", "plan"),
    [("legacy-auth", HTTP_PLAN), ("modern-auth", MODERN_HTTP_PLAN)],
    ids=["http-legacy-auth", "http-modern-auth"],
)
async def test_keyless_resends_over_faulty_http_take_effect_once(
    http: str, plan: FaultPlan
) -> None:
    """Streamable HTTP with bearer authentication: the caller is the principal, so the re-send
    after a broken stream, made on a new connection, is the same caller's."""
    mode = MODE[http.removesuffix("-auth")]
    shop = Shop(guarded=True, auth=True, work=HTTP_WORK)
    with http_shop(shop) as url:
        run = await run_chaos(shop, http_connect(url), plan, mode, HTTP_TIMEOUT)
    bare_shop = Shop(guarded=False, auth=True, work=HTTP_WORK)
    with http_shop(bare_shop) as url:
        bare = await run_chaos(bare_shop, http_connect(url), plan, mode, HTTP_TIMEOUT)
    assert_once(run)
    assert run.chaos.fault_counts()[Fault.CLOSE_AFTER_WRITE] and run.tally.reconnects
    assert run.chaos.connections > 1
    assert_contrast(run, bare)


@BACKENDS
@ERAS
async def test_a_deliberate_repeat_after_a_delivered_answer_still_runs(era: str) -> None:
    """Rule 15 does not merge everything: the re-send after a lost answer replays it, and the
    caller's identical call after it had that answer is a new payment."""
    shop = Shop(guarded=True)
    chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK}, tools={"pay"}), seed=SEED)
    resender = Resender(chaos, memory_connect(shop), MODE[era])
    with anyio.fail_after(BOUND):
        try:
            resent = await resender.pay("order-x")  # lost, then re-sent: replayed
            again = await resender.pay("order-x")  # delivered, then asked again: runs
        finally:
            await resender.run([])
    assert resent is not None and again is not None
    assert status(resent) == "replayed" and text(resent) == "paid order-x (execution 1)"
    assert status(again) == "executed" and text(again) == "paid order-x (execution 2)"
    assert shop.effects["order-x"] == 2


@BACKENDS
@ERAS
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="rule 15 residual: the REPLAY answering a re-send marks the record delivered, so"
    " the re-send's twin (another request id) claims a COMPLETED + delivered record and runs",
)
async def test_a_twinned_resend_after_a_lost_answer_runs_again(era: str) -> None:
    """A re-send that is itself dispatched twice, after a lost answer, takes effect twice.

    Message order (both eras, both backends, every run): tools/call id 3 runs (claim CLAIMED,
    stored delivered=True, handed out: `answers.sent`); the chaos swallows its answer; the
    client times out and sends notifications/cancelled {requestId: 3}, which marks the record
    undelivered (`answers.cancelled` -> `KeyStore.abandon`, fence 1); the re-send, id 4,
    claims with resend_only=True and gets REPLAY, and the store marks the record delivered
    (handed to this re-send); the copy of id 4 (id mcp-once-chaos-dup-1-2, microseconds later)
    claims with resend_only=True a COMPLETED + delivered record -> CLAIMED (fence 2) ->
    `Guard._run` runs the tool a second time; its answer is swallowed, the client keeps the
    replay. A twin of a call that *runs* is merged (it finds the claim IN_PROGRESS, BUSY ->
    waits -> replays); a replay is never in flight, so to the guard its twin is a deliberate
    repeat on that connection. The copy is held on the wire until the replay reached the
    client (`copies_held`): one the server had already read when the replay was handed out is
    merged (the guard judges arrival, `answers.handed_first`). The seeded runs dispatch first
    sends only twice (`BreakFirstSends`)."""
    shop = Shop(guarded=True)
    chaos = Chaos(
        FaultPlan(schedule={1: Fault.LOST_ACK, 2: Fault.DUPLICATE}, tools={"pay"}), seed=SEED
    )
    release = anyio.Event()
    server = shop.server()

    def connect(chaos: Chaos, mode: str) -> Client:
        return Client(chaos.wrap(copies_held(server, release)), mode=mode)

    resender = Resender(chaos, connect, MODE[era])
    with anyio.fail_after(BOUND):
        try:
            answer = await resender.pay("order-x")
        finally:
            release.set()
            await resender.run([])
    assert answer is not None and status(answer) == "replayed"
    assert shop.effects["order-x"] == 1, shop.effects


class TwinAtTheDoor:
    """Server middleware for one twinned `pay`: the original goes on only once the link's copy
    (a string id) has reached the server, and the copy only once `open` is set, so the copy is
    received while the original runs and claims after its answer was handed out."""

    def __init__(self) -> None:
        self.arrived = anyio.Event()
        self.open = anyio.Event()

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> Any:
        if ctx.method == "tools/call" and (ctx.params or {}).get("name") == "pay":
            if isinstance(ctx.request_id, str):
                self.arrived.set()
                await self.open.wait()
            else:
                await self.arrived.wait()
        return await call_next(ctx)


@asynccontextmanager
async def copies_held(server: MCPServer, release: anyio.Event) -> AsyncIterator[Any]:
    """A memory wire to `server` on which the link's copy of a request (a string id) is written
    only once `release` is set."""
    async with in_memory_transport(server) as (read, write):
        yield read, HeldCopies(write, release)


@dataclass
class HeldCopies:
    inner: Any
    release: anyio.Event

    async def send(self, item: SessionMessage) -> None:
        if isinstance(item.message, JSONRPCRequest) and isinstance(item.message.id, str):
            await self.release.wait()
        await self.inner.send(item)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def pay_a_twinned_call(connect: Connect, mode: str, *, then: anyio.Event) -> None:
    """One `pay` whose first send the link dispatches twice, executed and answered; `then` is
    set once the caller has the answer, and the copy's answer is awaited (swallowed)."""
    chaos = Chaos(FaultPlan(schedule={1: Fault.DUPLICATE}, tools={"pay"}), seed=SEED)
    resender = Resender(chaos, connect, mode, timeout=BOUND)
    with anyio.fail_after(BOUND):
        try:
            answer = await resender.pay("order-x")
        finally:
            then.set()
            await resender.run([])
    assert answer is not None and status(answer) == "executed"
    assert resender.tally.timeouts == 0


@BACKENDS
@ERAS
async def test_a_twin_received_while_its_original_ran_replays(era: str) -> None:
    """A twin the server had received while its original ran is merged, however late its
    claim: it was sent before the answer could be seen (rule 15's "in flight" is judged when a
    request arrives). Message order (forced by `TwinAtTheDoor`): tools/call N arrives and
    waits; its copy arrives (the SDK enters it in flight) and waits; N runs, is stored
    delivered and handed out (`answers.handed_first` notes the copy); the client has its
    answer; then the copy claims a COMPLETED + delivered record and replays. Before the guard
    judged arrival, the copy was taken for a deliberate repeat and paid a second time (seen in
    the seeded runs under load: the copy's handler scheduled after N's answer)."""
    door = TwinAtTheDoor()
    shop = Shop(guarded=True, middleware=[door])
    await pay_a_twinned_call(memory_connect(shop), MODE[era], then=door.open)
    assert shop.effects["order-x"] == 1, shop.effects


@BACKENDS
@ERAS
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="rule 15 residual: a twin the server receives only after its original's answer was"
    " handed out cannot be told from a deliberate repeat, so it runs",
)
async def test_a_twin_received_after_its_original_was_answered_runs_again(era: str) -> None:
    """A client's request dispatched twice, whose copy reaches the server only after the
    original's answer was handed out (and here read by the client). To the server that is an
    identical call after a delivered answer: intent (rule 15), it runs. The seeded runs stay
    out of it: `pay` answers a twinned request only once both copies have claimed its record
    (`Shop`), so the copy always finds the original in flight."""
    release = anyio.Event()
    shop = Shop(guarded=True)
    server = shop.server()

    def connect(chaos: Chaos, mode: str) -> Client:
        return Client(chaos.wrap(copies_held(server, release)), mode=mode)

    await pay_a_twinned_call(connect, MODE[era], then=release)
    assert shop.effects["order-x"] == 1, shop.effects


@BACKENDS
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="rule 15 residual: a broken stream whose answer the server wrote before the client"
    " tore the connection down is stored delivered; the re-send on a new connection runs",
)
async def test_a_broken_stream_whose_answer_was_written_runs_again() -> None:
    """Close-after-write over HTTP, when the server finishes before the client's teardown.

    The request reached the server; the link died above the client's HTTP transport, which
    still received the answer. The server saw nothing of it: `Guard._caller_gone` is false (no
    cancel flag, the request's scope not cancelled, no early cancel), so the record is stored
    delivered=True and handed out. The client's teardown (its DELETE of the session) comes
    after; the re-send on a new connection (same principal, so the same derived key) claims a
    COMPLETED + delivered record -> CLAIMED anew -> runs again. The seeded runs pass because
    there the tool still runs (`HTTP_WORK`) when the teardown arrives: the SDK terminates the
    session and cancels the request's scope behind the run's shield (`cancelled_beyond`), the
    record is stored undelivered and the re-send replays it; the same holds for 2026 HTTP (the
    aborted POST). Here the client tears down only once the result is stored.

    The same holds, with no timing to arrange, for a re-send answered from the record whose
    stream breaks: the replay is handed out at once (`_claim_loop` REPLAY, marked delivered by
    the claim), so the teardown always comes after it and the next re-send runs again (seen in
    a seeded run whose clean call timed out under load, which moved a CLOSE_AFTER_WRITE draw
    onto the re-send of an order whose answer had been lost: the seeded runs break first sends
    only)."""
    shop = Shop(guarded=True, auth=True, work=0)
    chaos = Chaos(FaultPlan(schedule={1: Fault.CLOSE_AFTER_WRITE}, tools={"pay"}), seed=SEED)

    async def after_the_answer() -> None:
        await anyio.to_thread.run_sync(shop.stored.wait, BOUND)

    with http_shop(shop) as url:
        resender = Resender(
            chaos, http_connect(url), MODE["legacy"], HTTP_TIMEOUT, after_the_answer
        )
        with anyio.fail_after(BOUND):
            try:
                answer = await resender.pay("order-x")
            finally:
                await resender.run([])
    assert answer is not None and resender.tally.reconnects == 1
    assert shop.effects["order-x"] == 1, shop.effects


@BACKENDS
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="rule 15 residual: over 2026-07-28 streamable HTTP no give-up of a lost answer"
    " reaches the server, so the re-send of it runs again",
)
async def test_a_lost_answer_over_2026_http_runs_again() -> None:
    """A lost answer (or one delayed past the timeout) over 2026-07-28 streamable HTTP.

    Each request is its own POST. The answer reached the client's HTTP transport and was lost
    above it, so that POST is over when the timeout fires; the SDK's 2026 transport then
    swallows the courtesy notifications/cancelled (`_consume_modern_cancellation`: no POST in
    flight to abort, and the 2026 wire has no client-to-server notifications). The server never
    hears of the give-up, and could not match it if it did: a single-exchange request has no
    connection (`connection_of` is None), so `answers.sent` keeps nothing. The record stays
    COMPLETED + delivered, and the re-send (same principal, same derived key) runs again. Over
    legacy HTTP the cancel is POSTed on the session and the re-send replays."""
    shop = Shop(guarded=True, auth=True, work=HTTP_WORK)
    chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK}, tools={"pay"}), seed=SEED)
    with http_shop(shop) as url:
        resender = Resender(chaos, http_connect(url), MODE["modern"], HTTP_TIMEOUT)
        with anyio.fail_after(BOUND):
            try:
                answer = await resender.pay("order-x")
            finally:
                await resender.run([])
    assert answer is not None and resender.tally.timeouts == 1
    assert shop.effects["order-x"] == 1, shop.effects
