"""A real load balancer in front of replicas (issue #15): three workload-server replicas on one
Redis behind Debian's nginx, round-robin, over stateless 2026-07-28 streamable HTTP.

The scenario of the replica tests in test_process_faults.py with the client-side balancer
replaced by nginx: `RetryingSession` talks to one URL; the chaos transport loses acks,
duplicates requests and breaks links between the client and nginx; halfway through, one replica
is SIGKILLed for good, and nginx (passive health checks, `deploy/mcp-proxy.conf`) must take it
out of rotation on its own. The ledger then shows no duplicate effect and no lost result, every
failure is a typed one, and what the dead replica left half-done is all that is left half-done.

nginx's access log (the request body and `$upstream_addr`) tells which replica each attempt of a
call reached: the proof that consecutive attempts of one call did land on different replicas,
i.e. that the shared store, not a sticky replica, is what made the retries safe.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from chaos_suite_settings import calls
from nginx_server import NginxServer  # tests/ is on sys.path (conftest)

from idempotency import wire
from mcp_once.scenarios import (
    Endpoint,
    Ledger,
    Replicas,
    Report,
    RunResult,
    Strays,
    check,
    default_plan,
    default_policy,
    open_replicas,
    run_workload,
    strays,
)
from orchestrator import streamable_http_transport

if TYPE_CHECKING:
    from mcp.client._transport import Transport

pytestmark = [pytest.mark.chaos, pytest.mark.anyio, pytest.mark.redis, pytest.mark.slow]

CALLS = calls(300, soak=3000)
#: The replica killed, as call number KILL_AT (0-based) starts.
VICTIM = 1
KILL_AT = CALLS // 2
#: Short, so that claims the dead replica held expire (and turn UNKNOWN) within the run.
LEASE = 2.0
#: The first attempt of each payment or write holds this long, so that the kill finds tools
#: mid-run on the victim.
TOOL_TIME = 0.05
STATELESS_ERA = "2026-07-28"


class BehindNginx(Endpoint):
    """The replicas as a client sees them through nginx: one URL, nginx picks the replica."""

    transport = "http"

    def __init__(self, replicas: Replicas, nginx: NginxServer) -> None:
        super().__init__(replicas.era)
        self.replicas = replicas
        self.nginx = nginx

    def make(self) -> Transport:
        return streamable_http_transport(self.nginx.url)

    async def ready(self) -> None:
        await self.replicas.ready()
        await self.nginx.wait_up()

    def describe(self) -> str:
        return f"http/{self.era} x{len(self.replicas.processes)} replicas behind nginx"


@dataclass(slots=True)
class Routing:
    """Where nginx sent the tools/call requests of a run, read from its access log."""

    #: key -> attempt number -> the replicas (indexes) that received a request of that attempt
    #: (two, when the chaos duplicated it).
    attempts: dict[str, dict[int, set[int]]] = field(default_factory=dict)
    #: The protocol versions and session ids the requests carried.
    versions: Counter[str] = field(default_factory=Counter)
    sessions: Counter[str] = field(default_factory=Counter)
    #: Requests nginx offered to more than one replica (the first could not be connected to).
    passed_on: int = 0
    statuses: Counter[int] = field(default_factory=Counter)

    def calls_on_several(self) -> int:
        """Logical calls whose requests reached two replicas or more."""
        return sum(len(set().union(*by.values())) >= 2 for by in self.attempts.values())

    def retries(self) -> tuple[int, int]:
        """(retries, those that reached a replica the attempt before had not reached)."""
        pairs = moved = 0
        for by in self.attempts.values():
            for attempt, replicas in by.items():
                before = by.get(attempt - 1)
                if before is not None:
                    pairs += 1
                    moved += bool(replicas - before)
        return pairs, moved


def routing(nginx: NginxServer, replicas: Replicas) -> Routing:
    """Read nginx's access log into a `Routing`, and tell `replicas` which keys each replica was
    sent (what its own client-side balancer would have noted), for `strays`."""
    index = {f"127.0.0.1:{process.port}": n for n, process in enumerate(replicas.processes)}
    seen = Routing()
    for request in nginx.requests():
        message = request.message()
        if message is None or message.get("method") != "tools/call":
            continue
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        assert isinstance(meta, dict), message
        key, attempt = meta.get(wire.KEY_META), meta.get(wire.ATTEMPT_META)
        assert isinstance(key, str) and isinstance(attempt, int), meta
        seen.versions[request.version] += 1
        seen.sessions[request.session] += 1
        seen.statuses[request.status] += 1
        seen.passed_on += len(request.upstreams) > 1
        if not request.upstreams:
            continue  # nginx answered itself: no replica saw it
        # The last upstream is the one that got the request; nginx moved on from the others
        # before sending it (it never resends a POST a replica received).
        replica = index[request.upstreams[-1]]
        replicas.keys_seen[replica].add(key)
        seen.attempts.setdefault(key, {}).setdefault(attempt, set()).add(replica)
    return seen


@asynccontextmanager
async def behind_nginx(
    ledger: Ledger, store_url: str | None, binary: str
) -> AsyncIterator[BehindNginx]:
    """Three replicas (guarded by the store at `store_url`; None: unguarded) behind nginx."""
    async with open_replicas(
        ledger, store_url, replicas=3, era="modern", lease=LEASE, hold=TOOL_TIME
    ) as replicas:
        upstreams = [f"127.0.0.1:{process.port}" for process in replicas.processes]
        with NginxServer(binary, upstreams) as nginx:
            yield BehindNginx(replicas, nginx)


async def run_with_a_kill(
    endpoint: BehindNginx, ledger: Ledger, mode: str, count: int
) -> RunResult:
    """The workload through nginx, under chaos, replica VICTIM SIGKILLed as call count/2 starts."""

    async def kill() -> None:
        await endpoint.replicas.kill(VICTIM)

    run = await run_workload(
        endpoint,
        mode=mode,  # type: ignore[arg-type]
        ledger=ledger,
        plan=default_plan(scale=1.5),
        seed=15,
        calls=count,
        policy=default_policy(attempt_timeout=0.5),
        concurrency=4,
        actions={count // 2: kill},
    )
    run.extra_faults["replica_sigkill"] = 1
    return run


def describe(
    report: Report, run: RunResult, replicas: Replicas, seen: Routing, left: Strays
) -> str:
    failures = Counter(r.error_type for r in run.records if r.outcome != "result")
    pairs, moved = seen.retries()
    lines = [
        report.summary(),
        f"  attempt failures: {report.attempt_failures}; failures by type: {dict(failures)}",
        f"  nginx: tools/call requests by status {dict(seen.statuses)}, passed on past a dead"
        f" replica {seen.passed_on}; calls on >= 2 replicas: {seen.calls_on_several()}"
        f" of {len(seen.attempts)}; retries {pairs}, on another replica {moved}",
        f"  keys per replica: {[len(keys) for keys in replicas.keys_seen]}",
        f"  left UNKNOWN/IN_PROGRESS: {len(left.orphans)} (live workers':"
        f" {len(left.orphans_alive)}); guarded tools run twice: {len(left.twice)}"
        f" (live workers': {len(left.twice_alive)})",
    ]
    return "\n".join(lines)


async def test_three_replicas_behind_nginx_with_chaos_and_a_sigkill(
    tmp_path: Path, redis_url: str, nginx_binary: str
) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    async with behind_nginx(ledger, redis_url, nginx_binary) as endpoint:
        replicas, nginx = endpoint.replicas, endpoint.nginx
        victim = f"127.0.0.1:{replicas.processes[VICTIM].port}"
        run = await run_with_a_kill(endpoint, ledger, "mcp-once", CALLS)
        report = check(run)
        seen = routing(nginx, replicas)
        left = await strays(replicas, run, redis_url)
        errors = nginx.errors()
    print(describe(report, run, replicas, seen, left))

    # The contract: no duplicate effect, no lost result, every failure a typed one.
    assert report.calls == CALLS >= 300
    assert report.ok and report.problems == [] and report.unexplained == 0, report.problems
    assert report.faults.get("lost_ack", 0) > 0 and report.faults.get("duplicate", 0) > 0
    # What is left half-done is the dead replica's alone (no live worker lost a call).
    assert left.orphans_alive == [] and left.twice_alive == []

    # The setting was the one claimed: stateless 2026-07-28 (no session), every replica used,
    # consecutive attempts of one call on different replicas, the victim served, then dropped.
    assert set(seen.versions) == {STATELESS_ERA} and set(seen.sessions) == {""}
    assert all(replicas.keys_seen), "a replica never got a call"
    pairs, moved = seen.retries()
    assert seen.calls_on_several() > 0 and moved > 0, (pairs, moved)
    assert replicas.processes[VICTIM].proc is None  # killed, never restarted
    assert victim in errors, "nginx never noticed the killed replica:\n" + errors


async def test_the_checker_sees_duplicates_behind_nginx_without_the_guard(
    tmp_path: Path, nginx_binary: str
) -> None:
    """The same setting, unguarded replicas and a naive retry loop: duplicates appear. The test
    above can therefore fail; nginx's round-robin alone makes nothing safe."""
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    async with behind_nginx(ledger, None, nginx_binary) as endpoint:
        run = await run_with_a_kill(endpoint, ledger, "naive", 100)
        report = check(run)
    print(report.summary())
    assert report.duplicates > 0 and not report.ok
