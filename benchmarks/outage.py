"""Benchmark 4: retry amplification during a total outage, and time to recover after it.

A real MCP server over streamable HTTP on 127.0.0.1 sits behind an outage switch: while the
switch is on, every POST gets a bare `503` (no JSON-RPC body), as from a load balancer whose
backends are all down. The switch counts `tools/call` POSTs — the load the outage sees.

Logical calls arrive open-loop (a fixed rate, whatever happens to earlier calls: agents do not
slow down because a server is down) to a tool annotated `idempotentHint: true`. Two clients, the
same transport, the same max attempts (3) and the same full-jitter backoff (0.1 s doubling, 5 s
cap):

* `mcp_once` — `RetryingSession` with its default per-session `RetryBudget` (10 tokens, 0.1).
* `tenacity` — `AsyncRetrying(stop=stop_after_attempt(3), wait=wait_random_exponential(...))`
  around `Client.call_tool`, retrying every `Exception`.

Amplification = attempts (tools/call POSTs the server side saw, matched to their logical call)
per logical call, over the calls that started and gave up while the outage lasted: the steady
state of a long outage (calls cut short by its end would flatter the baseline). Recovery
is timed from the instant the switch goes off: to the first call that succeeds, and to the end of
the backlog (every call in flight at that instant has finished, one way or the other).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import tenacity
from mcp.client import Client

from idempotency import MemoryKeyStore
from orchestrator import RetryBudget, RetryingSession, RetryPolicy, streamable_http_transport

from ._scale import Scale, run_async
from ._servers import bench_server, serve_http
from ._stats import spread

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
App = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Any]

MAX_ATTEMPTS = 3
WAIT_INITIAL = 0.1
WAIT_MAX = 5.0
CONTENDERS = ("mcp_once", "tenacity")


def _call_label(body: bytes) -> str | None:
    """The `text` argument of a tools/call body: each logical call sends a unique one."""
    try:
        message = json.loads(body)
        return str(message["params"]["arguments"]["text"])
    except (ValueError, KeyError, TypeError):
        return None


@dataclass
class OutageSwitch:
    on: bool = False
    tool_posts: int = 0
    #: tools/call POSTs per logical call (by its unique `text` argument), in or out of outage.
    posts_by_call: Counter[str] = field(default_factory=Counter)

    def wrap(self, app: App) -> App:
        async def guarded(scope: Scope, receive: Any, send: Any) -> None:
            if scope["type"] != "http" or scope["method"] != "POST":
                await app(scope, receive, send)
                return
            chunks = []
            more = True
            while more:
                message = await receive()
                chunks.append(message.get("body", b""))
                more = message.get("more_body", False)
            body = b"".join(chunks)
            if b'"tools/call"' in body:
                label = _call_label(body)
                if label is not None:
                    self.posts_by_call[label] += 1
            if self.on:
                if b'"tools/call"' in body:
                    self.tool_posts += 1
                await send({"type": "http.response.start", "status": 503, "headers": []})
                await send({"type": "http.response.body", "body": b"no healthy upstream"})
                return
            sent = False

            async def replay() -> Message:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()  # type: ignore[no-any-return]

            await app(scope, replay, send)

        return guarded


@dataclass
class _Phase:
    started_in_outage: int = 0
    failed: int = 0
    #: Labels of logical calls that started and finished while the outage lasted.
    inside: list[str] = field(default_factory=list)
    first_success_after: float | None = None
    last_in_flight_done: float = 0.0
    in_flight_at_end: int = 0


async def _run(
    contender: str, url: str, switch: OutageSwitch, *, rate: float, outage: float, tail: float
) -> dict[str, Any]:
    async with Client(streamable_http_transport(url)) as client:
        call: Callable[[int], Awaitable[Any]]
        budget: RetryBudget | None = None
        if contender == "mcp_once":
            policy = RetryPolicy(
                max_attempts=MAX_ATTEMPTS, wait_initial=WAIT_INITIAL, wait_max=WAIT_MAX
            )
            session = RetryingSession(client, policy=policy)
            budget = session.budget

            async def call(n: int) -> Any:
                return await session.call_tool("keyed", {"text": f"c{n}"})

        else:
            retrying = tenacity.AsyncRetrying(
                stop=tenacity.stop_after_attempt(MAX_ATTEMPTS),
                wait=tenacity.wait_random_exponential(multiplier=WAIT_INITIAL, max=WAIT_MAX),
                retry=tenacity.retry_if_exception_type(Exception),
                reraise=True,
                sleep=anyio.sleep,
            )

            async def call(n: int) -> Any:
                return await retrying(client.call_tool, "keyed", {"text": f"c{n}"})

        await call(-1)  # warm: tools listed, connection open
        phase = _Phase()
        in_flight_at_end: set[int] = set()
        in_flight: set[int] = set()
        recovered = anyio.Event()
        end_at: list[float] = []

        async def one(n: int) -> None:
            during = switch.on
            if during:
                phase.started_in_outage += 1
            in_flight.add(n)
            try:
                result = await call(n)
                ok = not getattr(result, "is_error", False)
            except Exception:
                ok = False
            finally:
                in_flight.discard(n)
            now = time.perf_counter()
            if not ok and during:
                phase.failed += 1
            if during and switch.on:
                phase.inside.append(f"c{n}")
            if end_at and n in in_flight_at_end:
                in_flight_at_end.discard(n)
                phase.last_in_flight_done = now - end_at[0]
            if ok and end_at and phase.first_success_after is None:
                phase.first_success_after = now - end_at[0]
                recovered.set()

        switch.tool_posts = 0
        switch.posts_by_call.clear()
        switch.on = True
        interval = 1.0 / rate
        async with anyio.create_task_group() as tg:
            start = time.perf_counter()
            n = 0
            while True:
                now = time.perf_counter()
                if switch.on and now - start >= outage:
                    switch.on = False
                    posts = switch.tool_posts
                    end_at.append(now)
                    in_flight_at_end.update(in_flight)
                    phase.in_flight_at_end = len(in_flight)
                    tokens = budget.tokens if budget is not None else None
                if not switch.on and (now - start >= outage + tail) and recovered.is_set():
                    break
                tg.start_soon(one, n)
                n += 1
                await anyio.sleep(max(0.0, start + n * interval - time.perf_counter()))
        started = phase.started_in_outage
        inside = phase.inside
        attempts = sum(switch.posts_by_call[label] for label in inside)
        return {
            "logical_calls_in_outage": started,
            "logical_calls_within_outage": len(inside),
            "attempts_of_those": attempts,
            "amplification": round(attempts / len(inside), 3) if inside else math.nan,
            "tool_posts_in_outage": posts,
            "posts_per_call_started_in_outage": round(posts / started, 3) if started else math.nan,
            "failed_in_outage": phase.failed,
            "recover_first_success_s": round(phase.first_success_after or math.nan, 4),
            "recover_backlog_s": round(phase.last_in_flight_done, 4),
            "in_flight_at_end": phase.in_flight_at_end,
            "budget_tokens_at_end": tokens,
            "successes_before_retries_resume": (
                None if budget is None or tokens is None else _successes_to_resume(budget, tokens)
            ),
        }


def _successes_to_resume(budget: RetryBudget, tokens: float) -> int:
    """How many successful calls refill a drained budget enough to allow retries again (until
    then every call still gets its first attempt: recovery itself is never throttled). Mirrors
    `RetryBudget.record_success` / `allows_retry`."""
    count = 0
    while tokens <= budget.max_tokens / 2:
        tokens = min(budget.max_tokens, tokens + budget.token_ratio)
        count += 1
    return count


async def _measure(scale: Scale) -> dict[str, Any]:
    switch = OutageSwitch()
    store = MemoryKeyStore()
    server = bench_server(store)
    rate = 100.0
    outage = scale.outage_seconds
    tail = scale.outage_tail
    rounds = scale.outage_rounds
    samples: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
    async with serve_http(server, app_wrapper=switch.wrap) as url:
        for round_no in range(rounds):
            order = CONTENDERS if round_no % 2 == 0 else tuple(reversed(CONTENDERS))
            for contender in order:
                samples[contender].append(
                    await _run(contender, url, switch, rate=rate, outage=outage, tail=tail)
                )
    await store.aclose()
    summary: dict[str, Any] = {}
    for contender, runs in samples.items():
        summary[contender] = {
            "amplification": spread([r["amplification"] for r in runs]),
            "recover_first_success_s": spread([r["recover_first_success_s"] for r in runs], 4),
            "recover_backlog_s": spread([r["recover_backlog_s"] for r in runs], 4),
            "runs": runs,
        }
    return {
        "arrival_rate_per_s": rate,
        "outage_seconds": outage,
        "max_attempts": MAX_ATTEMPTS,
        "backoff": f"full jitter, {WAIT_INITIAL} s doubling, cap {WAIT_MAX} s (both clients)",
        "rounds": rounds,
        "contenders": summary,
        "outage_amplification": summary["mcp_once"]["amplification"]["median"],
        "tenacity_amplification": summary["tenacity"]["amplification"]["median"],
    }


def measure(scale: Scale) -> dict[str, Any]:
    return run_async(scale, _measure, scale)


if __name__ == "__main__":
    from ._standalone import standalone

    standalone(__doc__, measure)
