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

The tests that show these can fail: the same run with unguarded replicas and a naive retry loop
has duplicates; and nginx told to resend POSTs (`non_idempotent`, which deploy/mcp-proxy.conf
leaves off) duplicates effects on unguarded replicas by itself, without any chaos.
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
from nginx_server import PROXY_CONF, NginxServer  # tests/ is on sys.path (conftest)

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
from orchestrator.chaos import FaultPlan

if TYPE_CHECKING:
    from mcp.client._transport import Transport

pytestmark = [pytest.mark.chaos, pytest.mark.anyio, pytest.mark.redis, pytest.mark.slow]

CALLS = calls(300, soak=3000)
#: The replica killed (mid-tool) once call number CALLS // 2 (0-based) has started.
VICTIM = 1
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
    #: Requests nginx offered to more than one replica: the first could not be connected to
    #: (or, when told to resend POSTs, timed out).
    passed_on: int = 0
    #: Requests nginx answered itself (no replica to send them to).
    unrouted: int = 0
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
        # The last upstream is the one that answered; with the deployed config nginx moved on
        # from the others before sending (it never resends a POST a replica received). None, or
        # the upstream group's name ("no live upstreams"): nginx answered, no replica saw it.
        replica = index.get(request.upstreams[-1]) if request.upstreams else None
        if replica is None:
            seen.unrouted += 1
            continue
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
    """The workload through nginx, under chaos, replica VICTIM SIGKILLed as call count/2 starts,
    as soon as a tool is mid-run on it (its effect done, its result not yet stored)."""
    victim = endpoint.replicas.pids()[VICTIM]

    async def kill() -> None:
        _, call_id, _ = await ledger.next_event("started", pid=victim)
        await endpoint.replicas.kill(VICTIM)
        print(f"replica {VICTIM} (pid {victim}) SIGKILLed with {call_id} mid-run on it")

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
    failures = Counter(f"{r.error_type} ({r.tool})" for r in run.records if r.outcome != "result")
    pairs, moved = seen.retries()
    lines = [
        report.summary(),
        f"  attempt failures: {report.attempt_failures}; failures by type: {dict(failures)}",
        f"  nginx: tools/call requests by status {dict(seen.statuses)}, passed on past a dead"
        f" replica {seen.passed_on}, answered by nginx itself {seen.unrouted}; calls on >= 2"
        f" replicas: {seen.calls_on_several()} of {len(seen.attempts)}; retries {pairs}, on"
        f" another replica {moved}",
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


# -- why deploy/mcp-proxy.conf keeps `non_idempotent` off ---------------------------------------

#: Each first attempt of a payment or a write outlasts nginx's read timeout below.
SLOW_TOOL = 0.3


def resending(tmp_path: Path) -> Path:
    """deploy/mcp-proxy.conf "improved": nginx resends a POST on read timeout (100 ms)."""
    text = PROXY_CONF.read_text()
    for deployed, changed in (
        ("proxy_next_upstream error timeout;", "proxy_next_upstream error timeout non_idempotent;"),
        ("proxy_read_timeout 300s;", "proxy_read_timeout 100ms;"),
    ):
        assert deployed in text, deployed
        text = text.replace(deployed, changed)
    location = tmp_path / "resending.conf"
    location.write_text(text)
    return location


@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "unguarded"])
async def test_nginx_resending_posts_duplicates_what_the_guard_does_not_stop(
    tmp_path: Path, redis_url: str, nginx_binary: str, guarded: bool
) -> None:
    """With `non_idempotent`, nginx itself resends a slow tool's POST to the next replica, no
    chaos needed, and the client cannot know. Unguarded replicas run it again (duplicates, with
    the careful client unchanged); guarded ones replay it from the shared store. So the deployed
    config leaves resending to the client, and the guard is what makes any resend harmless."""
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    async with open_replicas(
        ledger, redis_url if guarded else None, replicas=3, lease=5.0, hold=SLOW_TOOL
    ) as replicas:
        upstreams = [f"127.0.0.1:{process.port}" for process in replicas.processes]
        # max_fails=0: a timed-out replica stays in rotation (otherwise all three soon leave it).
        with NginxServer(
            nginx_binary, upstreams, location=resending(tmp_path), max_fails=0
        ) as nginx:
            run = await run_workload(
                BehindNginx(replicas, nginx),
                mode="mcp-once",
                ledger=ledger,
                plan=FaultPlan(),
                seed=15,
                calls=24,
                policy=default_policy(attempt_timeout=2.0),
                concurrency=4,
            )
            report = check(run)
            seen = routing(nginx, replicas)
    # One attempt (same key, same attempt number) run more than once: no client sent it twice
    # (there is no chaos), nginx did.
    resent_runs = sum(
        len(effects) - len({(effect.key, effect.attempt) for effect in effects})
        for effects in ledger.by_call().values()
    )
    print(
        report.summary(),
        f"\n  nginx resent past a timeout: {seen.passed_on}; attempts run again: {resent_runs}",
    )
    assert seen.passed_on > 0  # nginx did resend POSTs a replica had received
    if guarded:
        assert report.ok and report.duplicates == 0 and report.replays > 0
        assert resent_runs == 0
    else:
        assert report.duplicates > 0 and not report.ok
        assert resent_runs > 0
