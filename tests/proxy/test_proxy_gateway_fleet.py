"""One gateway in front of three servers nobody here wrote the guard into, as two `--listen`
replicas on one Redis behind nginx, under `orchestrator.chaos` (issue 43 item 6).

`mcp-once proxy --config FILE` (no `--server`) serves every entry of FILE on one front: the
TypeScript ledger server (`ledger_server.mjs`, stdio), `@modelcontextprotocol/server-memory` and
`mcp-server-git` (from the package index), each replica with a child of each. A few hundred keyed
calls through nginx, every kind of fault on the client's link (lost answers, duplicates, dropped
requests, broken streams) with retries; the ledger child of one replica SIGKILLed while it holds a
call after its effect. The verdict, per upstream, from what the upstreams themselves wrote:
- the ledger's effects file (a line per effect, fsynced before the answer);
- server-memory's graph file (an entity per call) and the requests that reached it (a tap on the
  link records each `tools/call` with its arguments: server-memory's writes are set-like, so a
  second run would leave the file as it was, and only the tap can show it);
- the repository's commits (a commit per call, its message the call's) and, as for memory, the
  requests that reached `mcp-server-git`.
No call's effect or delivery twice; every call ends with its result (during the run, or asked
again with the same key: at once for memory and git, whose calls must not overlap, and for the
ledger afterwards) or, for the ledger calls the kill caught, the server's typed
OUTCOME_UNKNOWN, which `mcp-once keys show --proxy ledger` shows; no effect whose call got
neither (a lost result); and the memory and git calls all got their results: the kill touched
only the ledger.

The second test runs the same gateway with the ledger's `charge` passed through by its policy
section (`[servers."ledger".tools."charge"] guard = false`): the ledger shows effects run twice
while memory and git, still guarded, show none, so the first test can fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from nginx_server import NginxServer  # tests/ is on sys.path (conftest)
from proxy_kit import NodeServers, meta_key, proxy_command, tapped, text
from test_proxy_desktop import git_repository
from test_proxy_fleet import PLAN, POLICY, ask_again, effects, until_effect

from mcp_once._cli import main
from mcp_once.scenarios import ServerProcess
from orchestrator import (
    NotExecuted,
    OutcomeUnknown,
    RetryingSession,
    streamable_http_transport,
)
from orchestrator.chaos import Chaos

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
    pytest.mark.redis,
    pytest.mark.slow,
]

SEED = 43
#: Logical calls per upstream (the ledger's two workers, memory's and git's one each: those
#: servers read, change and write back one file, so two of their calls at once could lose one).
CALLS = {"ledger": 150, "memory": 75, "repo": 75}
WORKERS = {"ledger": 2, "memory": 1, "repo": 1}
#: The upstreams whose calls must not overlap: a call that ended without its result is settled
#: before the next (`settle`).
SERIAL = frozenset(name for name, count in WORKERS.items() if count == 1)
#: The ledger call held mid-run when its child is killed (the workload's amounts are 1..150).
HELD = 100_001
HOLD_MS = 120_000
WAIT = 60.0


@dataclass
class Fate:
    """How one logical call ended for its caller."""

    upstream: str
    n: int
    key: str
    wait_ms: int = 0
    result: str | None = None
    failed: str | None = None
    replayed: bool = False
    attempts: int = 0
    #: The server said OUTCOME_UNKNOWN when asked again: the record is in doubt for good.
    unknown: bool = False

    @property
    def tool(self) -> str:
        """The front's name of the call's tool."""
        own = {"ledger": "charge", "memory": "create_entities", "repo": "git_commit"}
        return f"{self.upstream}_{own[self.upstream]}"

    @property
    def label(self) -> str:
        """What the upstream's state names the call by (entity name, commit message)."""
        return f"call-{self.n}"

    def arguments(self, repo: Path) -> dict[str, Any]:
        if self.upstream == "ledger":
            held = {"wait_ms": self.wait_ms} if self.wait_ms else {}
            return {"amount": self.n, **held}
        if self.upstream == "memory":
            entity = {"name": self.label, "entityType": "call", "observations": [self.key]}
            return {"entities": [entity]}
        return {"repo_path": str(repo), "message": self.label}

    def answered_right(self) -> bool:
        assert self.result is not None
        if self.upstream == "ledger":
            return self.result.startswith(f"charged {self.n} ")
        if self.upstream == "memory":
            return f'"{self.label}"' in self.result
        return self.result.startswith("Changes committed successfully")


@dataclass
class Gateway:
    replicas: list[ServerProcess]
    nginx: NginxServer
    state: Path
    ledger: Path
    memory: Path
    repo: Path
    taps: dict[str, Path]
    faults: Counter[str] = field(default_factory=Counter)


@asynccontextmanager
async def gateway(
    node_servers: NodeServers,
    git_server: Path,
    redis_url: str,
    nginx_binary: str,
    tmp_path: Path,
    *options: str,
) -> AsyncIterator[Gateway]:
    """The config file of three entries, two replicas of `mcp-once proxy --listen --config FILE`
    on one Redis (a prefix of this test's own), their state folder the test's, and nginx."""
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    memory = tmp_path / "memory.jsonl"
    repo = git_repository(tmp_path / "repo")
    await anyio.run_process(["git", "commit", "-q", "-m", "staged at start"], cwd=repo)
    taps = {name: tmp_path / f"{name}.tap" for name in ("memory", "repo")}
    git = [str(git_server), "--repository", str(repo)]
    servers = {
        "ledger": _entry(node_servers.ledger(ledger)),
        "memory": _entry(
            tapped(taps["memory"], node_servers.memory(), arguments=True),
            env={"MEMORY_FILE_PATH": str(memory)},
        ),
        "repo": _entry(tapped(taps["repo"], git, arguments=True)),
    }
    config = tmp_path / "gateway.json"
    config.write_text(json.dumps({"mcpServers": servers}, indent=2))
    state = tmp_path / "state"
    separator = "&" if "?" in redis_url else "?"
    store = f"{redis_url}{separator}prefix=gateway-{uuid.uuid4().hex[:8]}:"

    def replica(port: int) -> list[str]:
        listen = ["--listen", f"127.0.0.1:{port}", "--store", store, "--config", str(config)]
        return ["env", f"XDG_STATE_HOME={state}", *proxy_command(*options, *listen)]

    replicas = [ServerProcess(replica, log=tmp_path / f"replica-{n}.log") for n in range(2)]
    started: list[ServerProcess] = []
    try:
        for process in replicas:
            await anyio.to_thread.run_sync(process.start)
            started.append(process)
        with NginxServer(nginx_binary, [f"127.0.0.1:{r.port}" for r in replicas]) as nginx:
            yield Gateway(replicas, nginx, state, ledger, memory, repo, taps)
    finally:
        for process in started:
            process.kill()


def _entry(command: list[str], **extra: Any) -> dict[str, Any]:
    """A config entry running `command`."""
    return {"command": command[0], "args": command[1:], **extra}


def entities(memory: Path) -> Counter[str]:
    rows = [json.loads(line) for line in memory.read_text().splitlines()] if memory.exists() else []
    return Counter(row["name"] for row in rows if row.get("type") == "entity")


def commits(repo: Path) -> Counter[str]:
    done = subprocess.run(
        ["git", "log", "--format=%s"], cwd=repo, capture_output=True, text=True, check=True
    )
    return Counter(done.stdout.splitlines())


def deliveries(tap: Path, tool: str, label: Any) -> Counter[str]:
    """The `tools/call` requests of `tool` that reached the upstream, by `label(arguments)`."""
    rows = [json.loads(line) for line in tap.read_text().splitlines()] if tap.exists() else []
    return Counter(label(row["arguments"]) for row in rows if row["name"] == tool)


def counted(gw: Gateway) -> dict[str, dict[str, Counter[Any]]]:
    """Per upstream, the effects (by call label) its own state shows and, where a tap sees the
    link, the requests that reached it."""
    ledger = effects(gw.ledger)
    return {
        "ledger": {"effects": Counter({f"call-{n}": k for n, k in ledger.items()})},
        "memory": {
            "effects": entities(gw.memory),
            "delivered": deliveries(
                gw.taps["memory"], "create_entities", lambda a: a["entities"][0]["name"]
            ),
        },
        "repo": {
            "effects": Counter(
                {m: k for m, k in commits(gw.repo).items() if m.startswith("call-")}
            ),
            "delivered": deliveries(gw.taps["repo"], "git_commit", lambda a: a["message"]),
        },
    }


def _staging(repo: Path, fate: Fate) -> list[list[str]]:
    """The commands that leave the index holding the call's own change and nothing else: a
    call that ended without its result may have left its change staged (it never ran), and
    `git_commit` commits the whole index, so the next call would commit it under its own
    message and the first, asked again, would find nothing staged (a result with no effect)."""
    (repo / f"{fate.label}.txt").write_text(f"{fate.key}\n")
    return [["git", "reset", "-q"], ["git", "add", f"{fate.label}.txt"]]


async def stage(repo: Path, fate: Fate) -> None:
    """A change of the call's own staged, alone, for its commit to commit."""
    for command in _staging(repo, fate):
        await anyio.run_process(command, cwd=repo)


def asked_again(repo: Path) -> Callable[[Fate], tuple[str, dict[str, Any]]]:
    """`ask_again`'s call: a git call's change staged alone again before it is asked again (a
    no-op for the index where the call had run: its change is committed)."""

    def call(fate: Fate) -> tuple[str, dict[str, Any]]:
        if fate.upstream == "repo":
            for command in _staging(repo, fate):
                subprocess.run(command, cwd=repo, check=True)
        return fate.tool, fate.arguments(repo)

    return call


async def call(session: RetryingSession, fate: Fate, repo: Path) -> None:
    try:
        result, report = await session.call_tool_with_report(
            fate.tool, fate.arguments(repo), idempotency_key=fate.key
        )
    except (OutcomeUnknown, NotExecuted) as exc:
        fate.failed, fate.attempts = type(exc).__name__, exc.attempts
        return
    fate.result, fate.replayed = text(result), report.replayed
    fate.attempts = len(report.attempts)


async def kill_the_ledger_child(gw: Gateway, at: anyio.Event, held: Fate) -> None:
    """Once `at` is set: a ledger call sent straight to replica 0 and held after its effect,
    then that replica's ledger child SIGKILLed (its pid asked of it through the replica) and the
    replica answering a ledger call again (on a new child)."""
    await at.wait()
    url = gw.replicas[0].url
    async with Client(streamable_http_transport(url)) as direct:
        pid = int(text(await direct.call_tool("ledger_pid", {})))

        async def hold() -> None:
            with anyio.move_on_after(WAIT):
                try:
                    await direct.call_tool(
                        held.tool, held.arguments(gw.repo), meta=meta_key(held.key)
                    )
                except Exception as exc:  # -32012: the child died under it, as planned
                    held.failed = type(exc).__name__

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold)
            await until_effect(gw.ledger, HELD)
            os.kill(pid, signal.SIGKILL)
            gw.faults["upstream_sigkill"] += 1
        with anyio.fail_after(WAIT):
            again = int(text(await direct.call_tool("ledger_pid", {})))
        assert again != pid


async def settle(gw: Gateway, fate: Fate) -> None:
    """A call of a one-worker upstream that ended without its result, asked again with its key
    on a clean link until it answers, before its worker goes on: the call may still be running
    upstream (an attempt that timed out, then the retries answered IN_PROGRESS until the budget
    ran out), and the next call must not overlap it. A git call running late would find the next
    call's `git reset` had unstaged its change, or would commit the next call's staged change
    under its own message (the next then finds nothing staged); a late memory call would write
    back the graph file over the next one's. The change it staged is still staged: nothing else
    touches the index in between, so it is asked as it was sent."""
    await ask_again(gw.nginx.url, [fate], lambda f: (f.tool, f.arguments(gw.repo)))


async def run_calls(gw: Gateway, fates: list[Fate], chaos: Chaos, *, kill: bool) -> None:
    """The workload through nginx under `chaos`: each upstream's calls by its own workers, all
    at once; with `kill`, the ledger child killed as ledger call n/3 of n starts."""

    @asynccontextmanager
    async def connect() -> AsyncIterator[Client]:
        async with Client(chaos.wrap(streamable_http_transport(gw.nginx.url))) as client:
            yield client

    ledger = [f for f in fates if f.upstream == "ledger"]
    strike_at = anyio.Event()
    mark = ledger[len(ledger) // 3].n

    async def worker(session: RetryingSession, queue: Iterator[Fate]) -> None:
        for fate in queue:
            if fate.upstream == "ledger" and fate.n == mark:
                strike_at.set()
            if fate.upstream == "repo":
                await stage(gw.repo, fate)
            await call(session, fate, gw.repo)
            if fate.result is None and fate.upstream in SERIAL:
                await settle(gw, fate)

    held = Fate("ledger", HELD, f"held-{SEED}", HOLD_MS)
    async with (
        RetryingSession(connect=connect, policy=POLICY) as session,
        anyio.create_task_group() as tg,
    ):
        if kill:
            tg.start_soon(kill_the_ledger_child, gw, strike_at, held)
        async with anyio.create_task_group() as workers:
            for upstream, count in WORKERS.items():
                queue = iter([f for f in fates if f.upstream == upstream])
                for _ in range(count):
                    workers.start_soon(worker, session, queue)
    if kill:
        fates.append(held)


async def keys_show(
    gw: Gateway, fate: Fate, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> str | None:
    """The state of the call's record as `mcp-once keys show --proxy UPSTREAM` finds it (the
    upstream's own tool name; its store and scope from the replicas' manifests)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(gw.state))
    tool = fate.tool.removeprefix(f"{fate.upstream}_")
    argv = ["keys", "show", "--proxy", fate.upstream, "--client-key", fate.key, "--tool", tool]
    capsys.readouterr()
    status = await anyio.to_thread.run_sync(main, [*argv, "--json"])
    out = capsys.readouterr().out
    return str(json.loads(out)["state"]) if status == 0 else None


def make_fates(prefix: str, calls: dict[str, int]) -> list[Fate]:
    return [
        Fate(upstream, n, f"{prefix}-{SEED}-{upstream}-{n}")
        for upstream, count in calls.items()
        for n in range(1, count + 1)
    ]


async def test_a_gateway_of_three_servers_behind_nginx_with_chaos_and_a_child_killed(
    node_servers: NodeServers,
    git_server: Path,
    redis_url: str,
    nginx_binary: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    began = time.monotonic()
    fates = make_fates("gw", CALLS)
    chaos = Chaos(PLAN, seed=SEED)
    async with gateway(node_servers, git_server, redis_url, nginx_binary, tmp_path) as gw:
        await gw.nginx.wait_up()
        ran = time.monotonic()
        await run_calls(gw, fates, chaos, kill=True)
        workload = time.monotonic() - ran
        await ask_again(gw.nginx.url, fates, asked_again(gw.repo))
        served = Counter(
            request.upstreams[-1]
            for request in gw.nginx.requests()
            if request.upstreams and '"tools/call"' in request.body
        )
        found = counted(gw)
        faults = {**{k.value: v for k, v in chaos.fault_counts().items() if v}, **gw.faults}
    unknown = [f for f in fates if f.unknown]
    shown = [await keys_show(gw, f, capsys, monkeypatch) for f in unknown]
    completed = [
        await keys_show(gw, next(f for f in fates if f.upstream == name), capsys, monkeypatch)
        for name in ("memory", "repo")
    ]

    figures: dict[str, str] = {}
    for name, seen in found.items():
        own = [f for f in fates if f.upstream == name]
        labels = {f.label for f in own}
        twice = {label: n for kind in seen.values() for label, n in kind.items() if n > 1}
        strangers = {label for kind in seen.values() for label in kind} - labels
        effect = seen["effects"]
        lost = [f.label for f in own if effect[f.label] and f.result is None and not f.unknown]
        phantom = [f.label for f in own if f.result is not None and not effect[f.label]]
        wrong = {f.label: f.result for f in own if f.result is not None and not f.answered_right()}
        undecided = [f.label for f in own if f.result is None and not f.unknown]
        doubt = [f.label for f in own if f.unknown]
        figures[name] = (
            f"{len(own)} calls, {sum(f.failed is not None for f in own)} ended without a result"
            f" during the run, retries {sum(max(0, f.attempts - 1) for f in own)}, replays"
            f" {sum(f.replayed for f in own)}; effects {sum(effect[x] for x in labels)},"
            f" duplicates {len(twice)}, lost results {len(lost)}, UNKNOWN {len(doubt)}"
        )
        assert twice == {} and strangers == set(), (name, twice, strangers)
        assert lost == [] and phantom == [] and wrong == {} and undecided == [], (
            name,
            lost,
            phantom,
            wrong,
            undecided,
        )
    with capsys.disabled():
        print(
            f"\ngateway fleet: {len(fates)} calls in {workload:.1f} s,"
            f" {time.monotonic() - began:.1f} s in all; faults {faults};"
            f" tools/call per replica {dict(served)}"
        )
        for name, line in figures.items():
            print(f"  {name}: {line}")

    # In doubt for good: the held call and whatever ledger calls the kill caught, each shown
    # UNKNOWN by `keys show --proxy ledger`; memory and git untouched: every call answered.
    assert HELD in {f.n for f in unknown if f.upstream == "ledger"}
    assert {f.upstream for f in unknown} == {"ledger"}, [f.key for f in unknown]
    assert shown == ["unknown"] * len(unknown), shown
    assert completed == ["completed", "completed"], completed
    assert faults["lost_ack"] > 0 and faults["duplicate"] > 0
    assert sum(f.replayed for f in fates) > 0
    assert gw.faults == {"upstream_sigkill": 1}
    assert len(served) == 2, served


async def test_the_counts_see_duplicates_where_a_policy_section_passes_a_tool_through(
    node_servers: NodeServers,
    git_server: Path,
    redis_url: str,
    nginx_binary: str,
    tmp_path: Path,
) -> None:
    """The same gateway, faults and kinds of calls, with `[servers."ledger".tools."charge"]
    guard = false`: the ledger shows effects run twice (the requests the chaos delivers twice
    are enough: the client retries none of a destructive tool's lost answers when the front does
    not guard it), while memory and git, guarded, show none. The test above can therefore fail,
    and a server's policy section reaches that server only."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[servers."ledger".tools."charge"]\nguard = false\n')
    fates = make_fates("open", {"ledger": 120, "memory": 30, "repo": 30})
    options = ("--policy", str(policy))
    async with gateway(node_servers, git_server, redis_url, nginx_binary, tmp_path, *options) as gw:
        await gw.nginx.wait_up()
        await run_calls(gw, fates, Chaos(PLAN, seed=SEED), kill=False)
        found = counted(gw)
    twice = {
        name: sum(n > 1 for kind in seen.values() for n in kind.values())
        for name, seen in found.items()
    }
    print(f"gateway with the ledger's charge unguarded: calls run twice or more {twice}")
    assert twice["ledger"] > 0
    assert twice["memory"] == 0 and twice["repo"] == 0, twice
