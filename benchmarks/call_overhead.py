"""Benchmark 1: a keyed call against the same tool unwrapped — latency and throughput.

One MCP server offers `plain` (unwrapped) and `keyed` (the same body under `@idempotent`), so
their difference is what the guard costs. Measured for every combination of

* transport: `in_process` (`mcp.client.Client(server)`, no wire) and `http` (streamable HTTP on
  127.0.0.1; the server is its own process, as deployed);
* store: `memory` (in-process `MemoryKeyStore`), `sqlite` (embedded file, full runs only) and
  `redis` (a private redis-server on loopback);
* variant: `plain`, `keyed` (a plain `Client` attaching a fresh key: every call is a first
  execution), `retrying` (`RetryingSession` end to end: it mints the key) and `floor` (the same
  store work by a hand-minimal guard, `_servers.bench_server`: the floor any guard can reach).

Latency is one caller issuing calls back to back, the variants interleaved call by call;
throughput is 16 concurrent callers. Each round runs every combination; ratios are taken per
round (keyed p50 / plain p50 of the same round) and reported as median with min/max, next to
the absolute difference in milliseconds. `floor / plain` is the ceiling beside each ratio: what
keyed / plain would read if the guard cost nothing beyond its store work.

In process, client and server share one process, so `time.process_time` around each call is
all the CPU the call cost; keyed − plain is the guard's CPU per keyed call (floor − plain: the
floor's), reported next to the wall-time difference. Per round the mean (garbage collection is
a real cost), then the median of rounds. HTTP servers run on the asyncio loop unless `--uvloop`.

The result-size sweep (full runs) repeats the latency measurement for results of 100 B to
100 KB and draws `results/latency_vs_result_size.png`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from subprocess import DEVNULL
from typing import Any

import anyio
from anyio.abc import Process
from mcp.client import Client

from idempotency import open_store
from orchestrator import RetryingSession

from ._redis import REPO, RedisServer, free_port
from ._scale import Scale, run_async
from ._servers import bench_server, key_meta
from ._stats import percentile, spread
from ._timing import async_rate

TRANSPORTS = ("in_process", "http")
VARIANTS = ("plain", "keyed", "retrying", "floor")
#: Throughput (16 callers) is measured for these; the floor's latency is enough for its ceiling.
THROUGHPUT_VARIANTS = ("plain", "keyed", "retrying")
#: `_latencies` keys holding CPU microseconds per call (in process only), by variant.
CPU = "cpu_us:"
RESULT_SIZE = 200
SIZES = (100, 1_000, 10_000, 100_000)
THROUGHPUT_CALLERS = 16

Call = Callable[[str, int, int], Awaitable[None]]


def _store_url(store: str, redis_url: str, tmp: Path) -> str:
    if store == "memory":
        return "memory://"
    if store == "sqlite":
        return f"sqlite:///{tmp / 'keys.db'}"
    return redis_url


@contextlib.asynccontextmanager
async def _http_servers(store_urls: list[str], *, uvloop: bool) -> AsyncIterator[list[str]]:
    """One server process per store URL, all started at once, on the asyncio loop (uvloop if
    `uvloop`); yields their endpoint URLs."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started: list[tuple[Process, int]] = []
    try:
        for store_url in store_urls:
            port = free_port()
            command = server_command(store_url, port, uvloop=uvloop)
            proc = await anyio.open_process(
                command, cwd=REPO, env=env, stdin=DEVNULL, stdout=DEVNULL, stderr=None
            )
            started.append((proc, port))
        deadline = time.monotonic() + 60
        for proc, port in started:
            while True:
                try:
                    stream = await anyio.connect_tcp("127.0.0.1", port)
                except OSError:
                    if proc.returncode is not None or time.monotonic() > deadline:
                        raise RuntimeError("an HTTP benchmark server did not start") from None
                    await anyio.sleep(0.05)
                else:
                    await stream.aclose()
                    break
        yield [f"http://127.0.0.1:{port}/mcp" for _, port in started]
    finally:
        with anyio.CancelScope(shield=True):
            for proc, _ in started:
                proc.terminate()
            for proc, _ in started:
                with anyio.move_on_after(10):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


def server_command(store_url: str, port: int, *, uvloop: bool) -> list[str]:
    """The command line of one benchmark HTTP server process (`benchmarks._http_server`)."""
    command = [sys.executable, "-m", "benchmarks._http_server"]
    command += ["--store", store_url, "--port", str(port)]
    return [*command, "--uvloop"] if uvloop else command


async def open_client(stack: contextlib.AsyncExitStack, transport: str, target: str) -> Client:
    """A client of the benchmark server, closed with `stack`: in process (`target` is its key
    store's URL) or over HTTP (`target` is its endpoint URL)."""
    if transport == "in_process":
        store = open_store(target)
        stack.push_async_callback(store.aclose)
        return await stack.enter_async_context(Client(bench_server(store)))
    return await stack.enter_async_context(Client(target))


@contextlib.asynccontextmanager
async def _endpoint(transport: str, target: str, warmup: int) -> AsyncIterator[Call]:
    """A `call(variant, n, size)` against one transport+store combination; `target` is the
    store URL (in-process) or the server's endpoint URL (HTTP)."""
    nonce = secrets.token_hex(4)
    async with contextlib.AsyncExitStack() as stack:
        client = await open_client(stack, transport, target)
        retrying = RetryingSession(client)
        await retrying.refresh_tools()

        async def call(variant: str, n: int, size: int) -> None:
            args = {"text": f"{n}", "size": size}
            if variant == "plain":
                result = await client.call_tool("plain", args)
            elif variant in ("keyed", "floor"):
                result = await client.call_tool(variant, args, meta=key_meta(f"{nonce}-{n}"))
            else:
                result = await retrying.call_tool("keyed", args)
            if result.is_error:
                raise RuntimeError(f"the benchmark tool failed: {result}")

        numbers = iter(range(10**12))
        for variant in VARIANTS:  # warm: connections, scripts, tool lists
            for _ in range(warmup):
                await call(variant, next(numbers), RESULT_SIZE)

        async def unique_call(variant: str, _n: int, size: int) -> None:
            await call(variant, next(numbers), size)

        yield unique_call


async def _latencies(
    call: Call, variants: tuple[str, ...], calls: int, size: int
) -> dict[str, list[float]]:
    """Milliseconds per call by variant, the variants interleaved call by call (rotating which
    goes first), so that a change in machine load hits every variant alike; under `CPU +
    variant`, the process's CPU microseconds per call."""
    found: dict[str, list[float]] = {v: [] for v in variants}
    found.update({CPU + v: [] for v in variants})
    for n in range(calls):
        k = n % len(variants)
        for variant in variants[k:] + variants[:k]:
            cpu = time.process_time()
            started = time.perf_counter()
            await call(variant, n, size)
            found[variant].append((time.perf_counter() - started) * 1000)
            found[CPU + variant].append((time.process_time() - cpu) * 1e6)
    return found


def _latency_summary(rounds: list[dict[str, list[float]]], *, cpu: bool) -> dict[str, Any]:
    """`latency_summary` of every variant; with `cpu` (in process) also the CPU per call."""
    out = latency_summary(rounds, VARIANTS, ("keyed", "retrying", "floor"))
    if not cpu:
        return out

    def mean(r: dict[str, list[float]], variant: str) -> float:
        return statistics.fmean(r[CPU + variant])

    out["cpu_us_per_call"] = {v: spread([mean(r, v) for r in rounds], 1) for v in VARIANTS}
    for variant in ("keyed", "floor"):
        out[f"{variant}_minus_plain_cpu_us"] = spread(
            [mean(r, variant) - mean(r, "plain") for r in rounds], 1
        )
    return out


def latency_summary(
    rounds: list[dict[str, list[float]]], variants: Sequence[str], compared: Sequence[str]
) -> dict[str, Any]:
    """Per variant its p50 and p99 across rounds; per `compared` variant its difference and
    ratios to `plain`, paired within each round."""
    out: dict[str, Any] = {}
    for variant in variants:
        out[variant] = {
            "p50_ms": spread([percentile(r[variant], 50) for r in rounds]),
            "p99_ms": spread([percentile(r[variant], 99) for r in rounds]),
        }
    for variant in compared:
        out[f"{variant}_minus_plain_p50_ms"] = spread(
            [percentile(r[variant], 50) - percentile(r["plain"], 50) for r in rounds]
        )
        out[f"{variant}_vs_plain_p50"] = spread(
            [percentile(r[variant], 50) / percentile(r["plain"], 50) for r in rounds]
        )
        out[f"{variant}_vs_plain_p99"] = spread(
            [percentile(r[variant], 99) / percentile(r["plain"], 99) for r in rounds]
        )
    return out


async def _measure(scale: Scale) -> dict[str, Any]:
    stores = scale.overhead_stores
    calls = scale.overhead_calls
    window = scale.overhead_window
    rounds = scale.overhead_rounds
    combos = [(t, s) for t in TRANSPORTS for s in stores]
    combos += [("http", s) for s in scale.overhead_http_stores if s not in stores]
    latency: dict[tuple[str, str], list[dict[str, list[float]]]] = {c: [] for c in combos}
    rates: dict[tuple[str, str], dict[str, list[float]]] = {
        c: {v: [] for v in THROUGHPUT_VARIANTS} for c in combos
    }
    sweep: dict[tuple[str, str], dict[int, list[dict[str, list[float]]]]] = {}
    with RedisServer() as redis_server, tempfile.TemporaryDirectory() as tmp:
        async with contextlib.AsyncExitStack() as stack:
            endpoints: dict[tuple[str, str], Call] = {}
            targets: dict[tuple[str, str], str] = {}
            for transport, store in combos:
                folder = Path(tmp) / f"{transport}-{store}"
                folder.mkdir()
                targets[(transport, store)] = _store_url(store, redis_server.url, folder)
            http = [c for c in combos if c[0] == "http"]
            urls = await stack.enter_async_context(
                _http_servers([targets[c] for c in http], uvloop=scale.uvloop)
            )
            targets.update(zip(http, urls, strict=True))
            for combo in combos:
                endpoints[combo] = await stack.enter_async_context(
                    _endpoint(combo[0], targets[combo], scale.overhead_warmup)
                )
            for round_no in range(rounds):
                order = VARIANTS if round_no % 2 == 0 else tuple(reversed(VARIANTS))
                for combo in combos:
                    call = endpoints[combo]
                    latency[combo].append(await _latencies(call, order, calls, RESULT_SIZE))
                    if round_no >= scale.overhead_throughput_rounds:
                        continue
                    for variant in (v for v in order if v in THROUGHPUT_VARIANTS):

                        async def op(n: int, variant: str = variant, call: Call = call) -> None:
                            await call(variant, n, RESULT_SIZE)

                        rates[combo][variant].append(
                            await async_rate(THROUGHPUT_CALLERS, window, op)
                        )
            if scale.overhead_sweep:
                sweep = await _sweep(endpoints, rounds=3, calls=60)
    out: dict[str, Any] = {
        "result_size_bytes": RESULT_SIZE,
        "calls_per_round": calls,
        "rounds": rounds,
        "throughput_callers": THROUGHPUT_CALLERS,
        "throughput_window_seconds": window,
        "event_loop": "uvloop" if scale.uvloop else "asyncio",
        "latency": {},
        "throughput": {},
    }
    for (transport, store), runs in latency.items():
        summary = _latency_summary(runs, cpu=transport == "in_process")
        out["latency"].setdefault(transport, {})[store] = summary
        per_variant = rates[(transport, store)]
        entry: dict[str, Any] = {v: spread(per_variant[v], 0) for v in THROUGHPUT_VARIANTS}
        entry["keyed_vs_plain"] = spread(
            [k / p for k, p in zip(per_variant["keyed"], per_variant["plain"], strict=True)]
        )
        out["throughput"].setdefault(transport, {})[store] = entry
    if sweep:
        out["size_sweep"] = {
            f"{transport}/{store}": {
                str(size): {
                    "plain_p50_ms": spread([percentile(r["plain"], 50) for r in runs]),
                    "keyed_p50_ms": spread([percentile(r["keyed"], 50) for r in runs]),
                    "overhead_p50_ms": spread(
                        [percentile(r["keyed"], 50) - percentile(r["plain"], 50) for r in runs]
                    ),
                }
                for size, runs in by_size.items()
            }
            for (transport, store), by_size in sweep.items()
        }
    http_redis = out["latency"]["http"]["redis"]
    in_process_redis = out["latency"]["in_process"]["redis"]
    out["overhead_ratio_http"] = http_redis["keyed_vs_plain_p50"]["median"]
    out["overhead_ratio_in_process"] = in_process_redis["keyed_vs_plain_p50"]["median"]
    out["overhead_ratio_http_by_store"] = {
        s: v["keyed_vs_plain_p50"]["median"] for s, v in out["latency"]["http"].items()
    }
    out["overhead_ratio_in_process_by_store"] = {
        s: v["keyed_vs_plain_p50"]["median"] for s, v in out["latency"]["in_process"].items()
    }
    for transport in TRANSPORTS:
        out[f"floor_ratio_{transport}_by_store"] = {
            s: v["floor_vs_plain_p50"]["median"] for s, v in out["latency"][transport].items()
        }
    in_process = out["latency"]["in_process"]
    out["guard_cpu_us_by_store"] = {
        s: v["keyed_minus_plain_cpu_us"]["median"] for s, v in in_process.items()
    }
    out["floor_cpu_us_by_store"] = {
        s: v["floor_minus_plain_cpu_us"]["median"] for s, v in in_process.items()
    }
    out["guard_wall_us_by_store"] = {
        s: round(v["keyed_minus_plain_p50_ms"]["median"] * 1000, 1) for s, v in in_process.items()
    }
    return out


async def _sweep(
    endpoints: dict[tuple[str, str], Call], *, rounds: int, calls: int
) -> dict[tuple[str, str], dict[int, list[dict[str, list[float]]]]]:
    found: dict[tuple[str, str], dict[int, list[dict[str, list[float]]]]] = {}
    combos = [c for c in endpoints if c[1] in ("memory", "redis")]
    for round_no in range(rounds):
        order = ("plain", "keyed") if round_no % 2 == 0 else ("keyed", "plain")
        for combo in combos:
            for size in SIZES:
                sample = await _latencies(endpoints[combo], order, calls, size)
                found.setdefault(combo, {}).setdefault(size, []).append(sample)
    return found


def measure(scale: Scale) -> dict[str, Any]:
    return run_async(scale, _measure, scale)


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Latency overhead (keyed p50 − plain p50) against result size; None without matplotlib
    or without a size sweep."""
    sweep = result.get("size_sweep")
    if not sweep:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    for label, by_size in sweep.items():
        sizes = sorted(int(s) for s in by_size)
        medians = [by_size[str(s)]["overhead_p50_ms"]["median"] for s in sizes]
        lows = [by_size[str(s)]["overhead_p50_ms"]["min"] for s in sizes]
        highs = [by_size[str(s)]["overhead_p50_ms"]["max"] for s in sizes]
        ax.plot(sizes, medians, marker="o", label=label.replace("_", "-"))
        ax.fill_between(sizes, lows, highs, alpha=0.15)
    ax.set_xscale("log")
    ax.set_xlabel("tool result size (bytes of text)")
    ax.set_ylabel("keyed p50 − unwrapped p50 (ms)")
    ax.set_title("mcp-once: latency overhead of a keyed call vs result size")
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="transport/store", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


if __name__ == "__main__":
    from ._standalone import standalone

    standalone(__doc__, measure)
