"""Benchmark: the proxy hop beside the call it wraps and the bridges users already run (issue 46).

    uv run python -m benchmarks.proxy_hop [--quick] [--no-peers] [--upstream ledger] [--out FILE]

(`bench` runs it as its `proxy_hop` section, its targets in the verdict table.)

One upstream (`benchmarks._hop_upstream`: an SDK server over stdio with a read-only `read`, which
the proxy passes through, and an effect `write`, which it guards; both answer at once; or, with
`--upstream ledger`, the tests' TypeScript ledger server: `balance` read, `charge` written, each
charge fsynced to its ledger file before it answers), one
client (the SDK's `mcp.client.Client`), every target a process of its own on 127.0.0.1:

- stdio front: the upstream directly; the SDK floor (`--serve floor`: an SDK low-level server
  whose handlers forward the raw request to an SDK session on the upstream and do nothing else,
  the least any Python MCP hop can cost), and the same with a hand-minimal guard on each store
  (`--serve floor --store URL`: the least any hop that keeps a record of a call can cost, what the
  guarded targets are read against); FastMCP's bare `create_proxy` over one connected client;
  `mcp-once proxy` on the memory, SQLite and Redis stores.
- streamable HTTP front, the same stdio upstream behind it: `supergateway` (npm, `--stateful`),
  `mcp-proxy` (the package index's), FastMCP's bare `create_proxy`, `mcp-once proxy --listen` on
  memory and Redis. Peers are pinned (`PEERS`) and installed by `_peers.py` into a cache folder.
- an HTTP upstream (the same upstream served over streamable HTTP by a process of its own): the
  upstream directly, the SDK floor (bare and guarded on Redis), FastMCP's bare `create_proxy` and
  `mcp-once proxy --listen` (memory, Redis) in front of it, all with an HTTP front.

Latency: p50/p99 of `read` and of a keyed `write` (a fresh key each call: every guarded call a
first execution), the targets interleaved call by call in each round so load on this shared
machine falls on all alike; each figure also as a ratio to direct over stdio in the same round
(median over rounds). Throughput: calls/s of keyed `write` at 1, 16 and 64 callers (concurrent
calls on one session), a window of a few seconds per target in every round, the order turned
each round; at 16 callers, the verdicts' figure, several windows of half that per round, the
targets taking turns window by window; each figure the median of its windows, their range
printed beside the 16 callers'. Start-up: spawn to the first `tools/list` answered, direct and
through `mcp-once proxy` (median of 7 in a full run): a restarted proxy (its previous start's
answers replayed, the target's row) and a first start (replay off). The load average is printed
with the figures.

Verdicts: a target the issue states as a figure is met or not as measured. Where the SDK floor
is the bound instead (a target beyond it), the target also meets it by being level with it
(`LEVEL`): this run's 95 % interval for its figure over the floor's (`_stats.ratio_interval`,
from every call's latency, or every 16 callers' window) within 5 % of even on the slow side.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AsyncExitStack, ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp import StdioServerParameters
from mcp.client import Client

from ._peers import LEDGER_SERVER, PEERS, Peers, install_ledger, install_peers
from ._redis import REPO, RedisServer, free_port
from ._scale import FULL, QUICK, Scale
from ._servers import key_meta
from ._stats import interval_text, percentile, pooled, ratio_interval, spread
from .proxy import store_urls

#: The upstream every target fronts, as JSON in the environment (so that this benchmark's own
#: server processes front the same one): its command line and, for each role, the tool and
#: arguments called. By default the Python upstream; `--upstream ledger` the TypeScript ledger.
UPSTREAM_VARIABLE = "MCP_ONCE_HOP_UPSTREAM"
PYTHON_UPSTREAM = {
    "command": [sys.executable, "-m", "benchmarks._hop_upstream"],
    "read": ["read", {"text": "x"}],
    "write": ["write", {"text": "x"}],
}
DIRECT = "direct (stdio)"
CALLERS = (1, 16, 64)
#: The callers at which throughput is judged, measured in many short windows (`_round`).
WINDOWED = 16
#: The SDK floor over stdio; `GUARD_FLOOR` the same with a hand-minimal guard on a store.
FLOOR = "SDK floor (raw forward)"
GUARD_FLOOR = "SDK floor + guard, {store}"
#: Targets (p50, ratio to direct over stdio), what each is read from, and its floor: the SDK's
#: raw forward for a pass-through; for a guarded call the same forward with the least guard on
#: the same store (a do-nothing handler keeps no record, so it is no floor for a guarded call).
TARGETS = {
    "stdio pass-through read, memory": ("mcp-once proxy, memory", "read", 1.3, FLOOR),
    "stdio guarded write, memory": (
        "mcp-once proxy, memory", "write", 1.6, GUARD_FLOOR.format(store="memory")),
    "stdio guarded write, SQLite": (
        "mcp-once proxy, SQLite", "write", 2.0, GUARD_FLOOR.format(store="SQLite")),
}  # fmt: skip
#: Targets in front of an HTTP upstream (p50, added ms over that upstream directly), and floors.
HTTP_DIRECT = "direct (HTTP upstream)"
#: The SDK floor in front of the HTTP upstream (`_hop_floor.serve_http_floor`), and guarded.
HTTP_FLOOR = "SDK floor (HTTP, raw forward) -> HTTP upstream"
HTTP_GUARD_FLOOR = "SDK floor (HTTP) + guard, Redis -> HTTP upstream"
HTTP_TARGETS = {
    "--listen on an HTTP upstream, pass-through read, memory": (
        "mcp-once proxy --listen, memory -> HTTP upstream", "read", 1.5, HTTP_FLOOR),
    "--listen on an HTTP upstream, guarded write, Redis": (
        "mcp-once proxy --listen, Redis -> HTTP upstream", "write", 2.5, HTTP_GUARD_FLOOR),
}  # fmt: skip
#: The throughput target: this, at 16 callers, at least every HTTP-upstream peer's.
HTTP_GUARDED = "mcp-once proxy --listen, Redis -> HTTP upstream"
HTTP_PEERS = ("FastMCP create_proxy (HTTP) -> HTTP upstream",)
#: The same throughput target with an HTTP front on the stdio upstream, where the peers are the
#: stdio-to-HTTP bridges (each present only when the peers were installed), and the SDK's own
#: HTTP front on that upstream.
LISTEN_GUARDED = "mcp-once proxy --listen, Redis"
LISTEN_PEERS = (
    f"supergateway {PEERS['supergateway']}",
    f"mcp-proxy {PEERS['mcp-proxy']}",
    "FastMCP create_proxy (HTTP)",
)
LISTEN_FLOOR = "SDK floor (HTTP, raw forward)"
STARTUP_BOUND = 1.3
#: How near a floor a target may be and count as level with it (`level`): this run's 95 %
#: interval for its whole call's p50 over the floor's (the HTTP rows too, whose figure is the
#: added ms) at most this much above even, a rate's at most this much below. The floor is itself
#: a measurement; this is about twice the resolution at which a full run on this shared machine
#: tells two side-by-side figures apart (benchmarks/README.md, "Level with the floor").
LEVEL = 0.05
#: The client speaks the handshake era to every target: the one all the peers speak, and what
#: desktop clients send today.
MODE = "legacy"
#: The start-up row of a proxy that replays nothing (its first start, or any changed input).
FIRST_START = "mcp-once proxy (first start)"

Target = str | StdioServerParameters


def _spec() -> dict[str, Any]:
    found = os.environ.get(UPSTREAM_VARIABLE)
    return PYTHON_UPSTREAM if found is None else dict(json.loads(found))


def _upstream() -> list[str]:
    return list(_spec()["command"])


def _upstream_on(port: int) -> list[str]:
    """The upstream's command serving streamable HTTP on 127.0.0.1:`port` (both upstreams take
    `--port`)."""
    return [*_upstream(), "--port", str(port)]


def _use_ledger() -> None:
    """Front the TypeScript ledger server (tests/proxy/ledger_server.mjs, its SDK installed by
    `_peers.install_ledger`): `balance` is the read, `charge` the write."""
    node, prefix = install_ledger()
    folder = tempfile.mkdtemp(prefix="mcp-once-hop-ledger-")
    spec = {
        "command": [node, str(LEDGER_SERVER), str(prefix), folder],
        "read": ["balance", {}],
        "write": ["charge", {"amount": 1}],
    }
    os.environ[UPSTREAM_VARIABLE] = json.dumps(spec)


def _quiet_env() -> dict[str, str]:
    return {**os.environ, "FASTMCP_LOG_LEVEL": "WARNING", "PYTHONPATH": str(REPO)}


def _child(*args: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=list(args), env=_quiet_env())


def _child_of(command: list[str]) -> StdioServerParameters:
    return StdioServerParameters(command=command[0], args=command[1:], env=_quiet_env())


def _wait_port(port: int, process: subprocess.Popen[bytes], deadline: float = 60.0) -> None:
    """Until something listens on 127.0.0.1:`port` (or the process exits: it failed)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)  # polling a port: no event to wait on
    raise RuntimeError(f"{process.args!r} did not listen on {port} within {deadline} s")


@contextmanager
def _listening(command: list[str], port: int) -> Iterator[str]:
    process = subprocess.Popen(
        command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env=_quiet_env(),
    )  # fmt: skip
    try:
        _wait_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait(timeout=30)


def stdio_targets(folder: str, redis_url: str, every: bool) -> dict[str, Target]:
    """The stdio children by target name (each client starts its own); without `every`, only
    direct, the SDK floor (bare, and guarded on memory and SQLite) and mcp-once proxy on memory
    and SQLite."""
    targets: dict[str, Target] = {
        DIRECT: _child_of(_upstream()),
        FLOOR: _child("-m", "benchmarks.proxy_hop", "--serve", "floor"),
    }
    if every:
        targets["FastMCP create_proxy"] = _child("-m", "benchmarks.proxy_hop", "--serve", "bare")
    for store, url in store_urls(folder, redis_url, "floor-stdio").items():
        if store == "Redis" and not every:
            continue
        targets[GUARD_FLOOR.format(store=store)] = _child(
            "-m", "benchmarks.proxy_hop", "--serve", "floor", "--store", url
        )
    for store, url in store_urls(folder, redis_url, "stdio").items():
        if store == "Redis" and not every:
            continue
        targets[f"mcp-once proxy, {store}"] = _child(
            "-m", "mcp_once", "proxy", "--store", url, "--", *_upstream()
        )
    return targets


def http_targets(
    stack: ExitStack, folder: str, redis_url: str, peers: Peers | None
) -> dict[str, Target]:
    """The streamable HTTP fronts, each started here, by target name."""
    targets: dict[str, Target] = {}

    def start(name: str, command: list[str], port: int) -> None:
        targets[name] = stack.enter_context(_listening(command, port))

    if peers is not None:
        port = free_port()
        start(
            f"supergateway {PEERS['supergateway']}",
            [*peers.supergateway, "--stdio", " ".join(_upstream()), "--outputTransport",
             "streamableHttp", "--stateful", "--port", str(port), "--logLevel", "none"],
            port,
        )  # fmt: skip
        port = free_port()
        start(
            f"mcp-proxy {PEERS['mcp-proxy']}",
            [peers.mcp_proxy, "--host", "127.0.0.1", "--port", str(port), "--pass-environment",
             "--", *_upstream()],
            port,
        )  # fmt: skip
    port = free_port()
    start(
        LISTEN_FLOOR,
        [sys.executable, "-m", "benchmarks.proxy_hop", "--serve", "floor", "--port", str(port)],
        port,
    )  # fmt: skip
    _http_proxies(start, folder, redis_url, "http", "", [], ["--", *_upstream()])
    return targets


def _http_proxies(
    start: Callable[[str, list[str], int], None],
    folder: str,
    redis_url: str,
    front: str,
    label: str,
    bare: list[str],
    upstream: list[str],
) -> None:
    """Start FastMCP's bare proxy and `mcp-once proxy --listen` (memory, Redis), each with an
    HTTP front, on the upstream `bare` / `upstream` name (their arguments), names ending `label`."""
    port = free_port()
    start(
        f"FastMCP create_proxy (HTTP){label}",
        [sys.executable, "-m", "benchmarks.proxy_hop", "--serve", "bare", "--port", str(port),
         *bare],
        port,
    )  # fmt: skip
    for store, url in store_urls(folder, redis_url, front).items():
        if store == "SQLite":
            continue
        port = free_port()
        start(
            f"mcp-once proxy --listen, {store}{label}",
            [sys.executable, "-m", "mcp_once", "proxy", "--store", url,
             "--listen", f"127.0.0.1:{port}", *upstream],
            port,
        )  # fmt: skip


def http_upstream_targets(stack: ExitStack, folder: str, redis_url: str) -> dict[str, Target]:
    """The upstream served over streamable HTTP, directly and behind the HTTP-fronted hops (the
    SDK floor, bare and guarded on Redis, FastMCP's bare proxy, `mcp-once proxy --listen` on
    memory and Redis), by target name."""
    port = free_port()
    upstream = stack.enter_context(_listening(_upstream_on(port), port))
    targets: dict[str, Target] = {HTTP_DIRECT: upstream}

    def start(name: str, command: list[str], port: int) -> None:
        targets[name] = stack.enter_context(_listening(command, port))

    port = free_port()
    start(
        HTTP_FLOOR,
        [sys.executable, "-m", "benchmarks.proxy_hop", "--serve", "floor", "--port", str(port),
         "--upstream-url", upstream],
        port,
    )  # fmt: skip
    port = free_port()
    start(
        HTTP_GUARD_FLOOR,
        [sys.executable, "-m", "benchmarks.proxy_hop", "--serve", "floor", "--port", str(port),
         "--upstream-url", upstream, "--store",
         store_urls(folder, redis_url, "floor-http-upstream")["Redis"]],
        port,
    )  # fmt: skip
    _http_proxies(
        start, folder, redis_url, "http-upstream", " -> HTTP upstream",
        ["--upstream-url", upstream], ["--upstream", upstream],
    )  # fmt: skip
    return targets


async def _call(client: Client, role: str) -> None:
    tool, arguments = _spec()[role]
    result = await client.call_tool(tool, arguments, meta=key_meta(secrets.token_hex(8)))
    if result.is_error:
        raise RuntimeError(f"{tool} failed: {result.content}")


def turned(names: Sequence[str], number: int, rounds: int) -> list[str]:
    """The order of round `number`'s throughput windows: `names` turned by a 1/`rounds` share of
    them per round, so that over the rounds each target's windows fall early, midway and late in
    a round, and no target always runs first."""
    turn = number * max(1, len(names) // rounds) % len(names)
    return [*names[turn:], *names[:turn]]


async def _round(
    targets: dict[str, Target], calls: int, seconds: float, passes: int, order: Sequence[str]
) -> tuple[dict[tuple[str, str], list[float]], dict[str, dict[int, list[float]]]]:
    """`calls` of each tool per target, interleaved call by call; then, when `seconds`, each
    target's throughput on the same session: one `seconds` window at 1 and at 64 callers, one
    target after another in `order`, and at 16 callers (the verdicts' figure) `passes` windows
    of half that, the targets taking turns window by window (the order turned each pass), so
    that a verdict compares targets measured moments apart, many times over."""
    async with AsyncExitStack() as stack:
        clients = {
            name: await stack.enter_async_context(Client(t, mode=MODE))
            for name, t in targets.items()
        }
        for client in clients.values():
            await client.list_tools()
            for _ in range(10):  # warm-up
                await _call(client, "read")
                await _call(client, "write")
        found: dict[tuple[str, str], list[float]] = {
            (name, tool): [] for name in clients for tool in ("read", "write")
        }
        for _ in range(calls):
            for (name, tool), values in found.items():
                start = time.perf_counter()
                await _call(clients[name], tool)
                values.append(time.perf_counter() - start)
        if not seconds:
            return found, {}
        rates: dict[str, dict[int, list[float]]] = {name: {} for name in order}
        for callers in CALLERS:
            windowed = callers == WINDOWED
            for number in range(passes if windowed else 1):
                for name in turned(order, number, passes) if windowed else order:
                    window = seconds / 2 if windowed else seconds
                    rate = await _throughput(clients[name], callers, window)
                    rates[name].setdefault(callers, []).append(rate)
        return found, rates


async def _caller(client: Client, end: float, counts: list[int], index: int) -> None:
    while time.perf_counter() < end:
        await _call(client, "write")
        counts[index] += 1


async def _throughput(client: Client, callers: int, seconds: float) -> float:
    """Keyed `write` calls/s with `callers` concurrent callers on one session."""
    began = time.perf_counter()
    counts = [0] * callers
    async with anyio.create_task_group() as tg:
        for index in range(callers):
            tg.start_soon(_caller, client, began + seconds, counts, index)
    return sum(counts) / (time.perf_counter() - began)


async def _startup(target: StdioServerParameters) -> float:
    began = time.perf_counter()
    async with Client(target, mode=MODE) as client:
        await client.list_tools()
        return time.perf_counter() - began


def measure(scale: Scale, *, peers: bool = True) -> dict[str, Any]:
    """Every figure of one run (see the module doc): what `bench` runs."""
    every = scale.hop_every_target
    calls, rounds, seconds = scale.hop_calls, scale.hop_rounds, scale.hop_seconds
    load = [round(x, 2) for x in os.getloadavg()]
    installed = install_peers() if peers and every else None
    out: dict[str, Any] = {"load_average_at_start": load, "peers": installed is not None}
    with (
        tempfile.TemporaryDirectory() as folder,
        RedisServer() as redis_server,
        ExitStack() as stack,
    ):
        targets = stdio_targets(folder, redis_server.url, every)
        if every:
            targets.update(http_targets(stack, folder, redis_server.url, installed))
            targets.update(http_upstream_targets(stack, folder, redis_server.url))
        samples: dict[tuple[str, str], list[list[float]]] = {}
        ratios: dict[tuple[str, str], list[float]] = {}
        windows: dict[str, dict[int, list[list[float]]]] = {}
        for number in range(rounds):
            order = turned(list(targets), number, rounds)
            this, rates = anyio.run(_round, targets, calls, seconds, scale.hop_passes, order)
            for name, by_callers in rates.items():
                for callers, rate in by_callers.items():
                    windows.setdefault(name, {}).setdefault(callers, []).append(rate)
            for (name, tool), values in this.items():
                samples.setdefault((name, tool), []).append(values)
                base = statistics.median(this[(DIRECT, tool)])
                ratios.setdefault((name, tool), []).append(statistics.median(values) / base)
        out["latency"] = {
            f"{name} | {tool}": {
                "p50_ms": round(percentile(pooled(rounds_), 50) * 1e3, 3),
                "p99_ms": round(percentile(pooled(rounds_), 99) * 1e3, 3),
                "ratio_p50": round(statistics.median(ratios[(name, tool)]), 3),
            }
            for (name, tool), rounds_ in samples.items()
        }
        out["versus_floor"] = {
            f"{name} | {tool}": ratio_interval(samples[(name, tool)], samples[(floor, tool)])
            for name, tool, _, floor in [*TARGETS.values(), *HTTP_TARGETS.values()]
            if (name, tool) in samples and (floor, tool) in samples
        }
        out["calls_per_second"] = {
            name: {str(c): round(statistics.median(pooled(r)), 1) for c, r in by_callers.items()}
            for name, by_callers in windows.items()
        }
        out["calls_per_second_windows"] = {
            name: {str(c): [[round(x, 1) for x in w] for w in r] for c, r in by_callers.items()}
            for name, by_callers in windows.items()
        }
    out["startup_s"] = _startups(scale.hop_startups)
    out["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out["targets"] = verdicts(out)
    return out


def _startups(rounds: int) -> dict[str, float]:
    """Spawn to first `tools/list` answered, medians of `rounds` interleaved: the upstream
    directly; the proxy replaying its previous start's answers (`mcp_once/_upstream/replay.py`:
    what a restarted proxy does; one start records them first), in a state folder of this run's
    own; and the proxy's first start (replay off: what any start with changed inputs costs)."""
    with tempfile.TemporaryDirectory() as state:
        argv = ["-m", "mcp_once", "proxy", "--store", "memory://", "--", *_upstream()]
        env = {**_quiet_env(), "XDG_STATE_HOME": state}
        replayed = StdioServerParameters(command=sys.executable, args=argv, env=env)
        first = StdioServerParameters(
            command=sys.executable, args=argv, env={**env, "MCP_ONCE_REPLAY": "0"}
        )
        anyio.run(_startup, replayed)  # records the answers the next starts replay
        times: dict[str, list[float]] = {"direct": [], "mcp-once proxy": [], FIRST_START: []}
        for _ in range(rounds):  # interleaved, as the calls are
            times["direct"].append(anyio.run(_startup, _child_of(_upstream())))
            times["mcp-once proxy"].append(anyio.run(_startup, replayed))
            times[FIRST_START].append(anyio.run(_startup, first))
    return {name: round(statistics.median(values), 3) for name, values in times.items()}


def level(interval: dict[str, float] | None, faster: bool) -> bool:
    """Whether a target is level with its floor: this run's 95 % interval for its figure over
    the floor's (`ratio_interval`) lies within `LEVEL` of even on the side that matters (no more
    than that slower: a latency's `high`, `faster` a rate's `low`)."""
    if interval is None:
        return False
    return interval["low"] >= 1 - LEVEL if faster else interval["high"] <= 1 + LEVEL


def _level_text(which: str, floor_name: str) -> str:
    return f", or level with it (within {LEVEL:.0%} at 95 %)" if which == floor_name else ""


def verdicts(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Each issue 46 target with its measured ratio; the SDK floor beside it. Where the floor is
    the bound (a target beyond it), a target also meets it by being level with it (`level`):
    two figures measured side by side in one run differ by noise alone, and a bound that is
    itself a measurement is met within that noise or not told apart from it."""
    rows = []
    latency = out["latency"]
    versus = out.get("versus_floor", {})
    for label, (name, tool, target, floor_name) in TARGETS.items():
        value = latency[f"{name} | {tool}"]["ratio_p50"]
        floor = latency[f"{floor_name} | {tool}"]["ratio_p50"]
        # As the HTTP rows: a target beyond the floor (the SDK's own transport, and for a guarded
        # call the least guard on the same store) takes the floor instead.
        bound, which = (floor, floor_name) if floor > target else (target, "target")
        interval = versus.get(f"{name} | {tool}")
        rows.append({
            "metric": f"{label} / direct, p50", "measured": value, "ceiling": floor,
            "floor": floor_name,
            "target": f"<= {bound}x ({which}; target {target}x){_level_text(which, floor_name)}",
            "met": value <= bound or (which == floor_name and level(interval, faster=False)),
            "reachable": floor <= target, "versus_floor": interval,
        })  # fmt: skip
    if f"{HTTP_DIRECT} | read" in latency:
        rows.extend(http_verdicts(out))
    startup = out["startup_s"]
    ratio = round(startup["mcp-once proxy"] / startup["direct"], 3)
    rows.append({"metric": "start-up to first tools/list / direct", "measured": ratio,
                 "ceiling": None, "target": f"<= {STARTUP_BOUND}x", "met": ratio <= STARTUP_BOUND,
                 "reachable": None})  # fmt: skip
    return rows


def http_verdicts(out: dict[str, Any]) -> list[dict[str, Any]]:
    """The HTTP-upstream targets: added p50 ms over the upstream directly (interleaved in the
    same rounds), each judged against the larger of its target and what the SDK floor adds in the
    same run (issue 46: a target beyond the SDK's own transport takes the floor instead; `bound`
    says which was used; level with that floor meets it, as in `verdicts`), and guarded
    throughput at 16 callers against the bare proxy's pass-through."""
    rows = []
    latency = out["latency"]
    versus = out.get("versus_floor", {})

    def added(name: str, tool: str) -> float:
        return round(
            latency[f"{name} | {tool}"]["p50_ms"] - latency[f"{HTTP_DIRECT} | {tool}"]["p50_ms"], 3
        )

    for label, (name, tool, target, floor_name) in HTTP_TARGETS.items():
        value = added(name, tool)
        floor = added(floor_name, tool) if f"{floor_name} | {tool}" in latency else None
        bound, which = (
            (floor, floor_name) if floor is not None and floor > target else (target, "target")
        )
        interval = versus.get(f"{name} | {tool}")
        rows.append({
            "metric": f"{label}, p50 ms over direct", "measured": value, "ceiling": floor,
            "floor": floor_name,
            "target": f"<= +{bound} ms ({which}; target +{target}){_level_text(which, floor_name)}",
            "met": value <= bound or (which == floor_name and level(interval, faster=False)),
            "reachable": None if floor is None else floor <= target, "versus_floor": interval,
        })  # fmt: skip
    rates = out["calls_per_second"]
    windows = out.get("calls_per_second_windows", {})
    for where, guarded, peers, floor_name in (
        ("an HTTP upstream", HTTP_GUARDED, HTTP_PEERS, HTTP_FLOOR),
        ("a stdio upstream", LISTEN_GUARDED, LISTEN_PEERS, LISTEN_FLOOR),
    ):
        row = throughput_verdict(rates, where, guarded, peers, floor_name, windows)
        if row is not None:
            rows.append(row)
    return rows


def throughput_verdict(
    rates: dict[str, dict[str, float]],
    where: str,
    guarded: str,
    peers: Sequence[str],
    floor: str,
    windows: dict[str, dict[str, list[list[float]]]] | None = None,
) -> dict[str, Any] | None:
    """`guarded`'s calls/s at 16 callers over the best of `peers`' (those measured), judged
    against 1.0x or, where the SDK's own HTTP front (`floor`) is itself slower than that peer
    (the target beyond the SDK's transport, as issue 46 allows), against the floor's rate, which
    being level with it (`level`, from the 16 callers' `windows`) also meets; None when this run
    measured neither side."""
    present = [rates[peer]["16"] for peer in peers if peer in rates]
    if guarded not in rates or not present:
        return None
    best = max(present)
    measured = rates[guarded]["16"]
    ceiling = rates[floor]["16"] if floor in rates else None
    bound, which = (
        (ceiling, "SDK floor") if ceiling is not None and ceiling < best else (best, "best peer")
    )
    interval = None
    if which == "SDK floor" and windows and guarded in windows and floor in windows:
        interval = ratio_interval(windows[guarded]["16"], windows[floor]["16"])
    ratio = round(measured / best, 3)
    return {
        "metric": f"--listen on {where}, guarded Redis calls/s at 16 / best peer's",
        "measured": ratio,
        "ceiling": None if ceiling is None else round(ceiling / best, 3),
        "target": f">= {round(bound / best, 3)}x ({which}: {bound:.0f} calls/s)"
        + _level_text(which, "SDK floor"),
        "met": measured >= bound or (which == "SDK floor" and level(interval, faster=True)),
        "reachable": None if ceiling is None else ceiling >= best,
        "versus_floor": interval,
    }


def _print(out: dict[str, Any], calls: int, rounds: int) -> None:
    print(f"\n{calls} calls per tool x {rounds} rounds, load average {out['load_average_at_start']}"
          f" at start, {out['load_average_at_end']} at end")  # fmt: skip
    print(f"{'target | tool':<48} {'p50 ms':>8} {'p99 ms':>8} {'/direct':>8}")
    for name, row in out["latency"].items():
        print(f"{name:<48} {row['p50_ms']:8.3f} {row['p99_ms']:8.3f} {row['ratio_p50']:8.3f}")
    print(f"\n{'keyed write calls/s (median of windows)':<48} "
          + " ".join(f"{c:>8}" for c in CALLERS) + "   16: windows")  # fmt: skip
    for name, rates in out["calls_per_second"].items():
        windowed = spread(pooled(out["calls_per_second_windows"][name]["16"]), 0)
        print(f"{name:<48} " + " ".join(f"{rates[str(c)]:8.1f}" for c in CALLERS)
              + f"   {windowed['min']:.0f}-{windowed['max']:.0f}")  # fmt: skip
    startup = out["startup_s"]
    print(f"\nstart-up to first tools/list: direct {startup['direct']} s,"
          f" mcp-once proxy {startup['mcp-once proxy']} s (replayed),"
          f" {startup.get(FIRST_START)} s (first start)")  # fmt: skip
    for row in out["targets"]:
        verdict = "met" if row["met"] else "NOT met"
        floor = (
            "" if row["ceiling"] is None else f" ({row.get('floor', 'SDK floor')} {row['ceiling']})"
        )
        interval = row.get("versus_floor")
        if interval is not None:
            floor += f", over it {interval_text(interval)}"
        print(f"target {row['metric']}: {row['measured']} {row['target']}{floor}: {verdict}")


async def _serve(
    mode: str, port: int | None, upstream_url: str | None = None, store_url: str | None = None
) -> None:
    """This benchmark's own servers: FastMCP's bare proxy or the SDK floor (with an HTTP front on
    `port`, else stdio; in front of `upstream_url`, else the stdio upstream; with `store_url`,
    the upstream's effect tool guarded by hand on that store)."""
    if mode == "floor":
        from ._hop_floor import guarding, serve_floor, serve_http_floor

        async with guarding(_spec()["write"][0], store_url) as guarded:
            if port is None:
                await serve_floor(_upstream(), guarded)
            else:  # an HTTP front, on the HTTP upstream or (no URL) the stdio one
                await serve_http_floor(upstream_url or _upstream(), port, guarded)
        return
    from fastmcp import Client as FastMCPClient
    from fastmcp.client.transports import ClientTransport, StdioTransport, StreamableHttpTransport
    from fastmcp.server import create_proxy

    command, *args = _upstream()
    transport: ClientTransport = (
        StdioTransport(command, args, env=_quiet_env(), keep_alive=False)
        if upstream_url is None
        else StreamableHttpTransport(upstream_url)
    )
    client = FastMCPClient(transport)
    async with client:
        proxy = create_proxy(client)
        if port is None:
            await proxy.run_async(transport="stdio", show_banner=False)
        else:
            await proxy.run_async(
                transport="http", host="127.0.0.1", port=port, show_banner=False,
                log_level="warning",
            )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="bench --quick's length")
    parser.add_argument("--no-peers", action="store_true", help="skip supergateway, mcp-proxy")
    parser.add_argument(
        "--upstream", choices=("python", "ledger"), default="python", help="%(default)s"
    )
    parser.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--serve", choices=("floor", "bare"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream-url", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        anyio.run(_serve, args.serve, args.port, args.upstream_url, args.store)
        return 0
    if args.upstream == "ledger":
        _use_ledger()
    scale = QUICK if args.quick else FULL
    out = measure(scale, peers=not args.no_peers)
    _print(out, scale.hop_calls, scale.hop_rounds)
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0 if all(row["met"] for row in out["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
