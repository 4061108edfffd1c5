"""The two test tiers: `uv run pytest` runs the fast tier (minutes on a 2-core machine), and
`uv run pytest --full` runs everything, as `.ci/run` always does.

Why tiers: the whole suite takes ~14 minutes on a 2-core machine, most of it in tests that start
real deployments (a Redis Cluster, Sentinels, TLS, nginx, a Temporal dev server), kill processes,
or soak. A newcomer's first `uv run pytest` should answer in minutes, and CI must still run all.

A test is in the slow tier when it is marked `slow` by hand, or when what it needs says so, so that
a new test of the same kind lands in the right tier without anyone remembering to mark it:
- it uses a fixture that starts a multi-process deployment (`SLOW_FIXTURES`);
- it lives in a module or folder of process-killing, engine or soak tests (`SLOW_PLACES`);
- its name says it starts and races or kills processes, or drives the console script
  (`SLOW_NAMES`);
- its parameters name such a deployment, or a transport that needs a server process or socket
  (`SLOW_PARAMETERS`: stdio, HTTP): the in-memory variants of the same tests stay in the fast
  tier, which is what keeps it within ~4 minutes on a 2-core machine.
"""

from __future__ import annotations

import re

import pytest

#: Fixtures that start a deployment of several processes (or a whole load balancer).
SLOW_FIXTURES = frozenset(
    {
        "redis_cluster",
        "redis_cluster_url",
        "redis_sentinel",
        "redis_sentinel_url",
        "fresh_sentinel",
        "redis_tls_files",
        "redis_tls_cluster",
        "redis_tls_sentinel",
        "fresh_tls_sentinel",
        "nginx_binary",
    }
)

#: Paths (relative to the repository, `/`-separated) of folders or modules that are slow as a whole.
SLOW_PLACES = (
    "tests/durable/",  # the durable engines: Temporal dev server, DBOS, LangGraph, killed workers
    "tests/chaos/",  # fault search, random plans, killed replicas, nginx
    "tests/run/test_run_kill_resume.py",  # agents killed mid-run and resumed
    "tests/fastmcp/test_fastmcp_chaos.py",
    "tests/examples/",  # every example as a real process
    "tests/test_bench_quick.py",
    "tests/clients_real/",  # npm clients (Inspector CLI, TypeScript SDK)
    "tests/docs/test_snippets.py",  # every snippet of the docs as a program
    "tests/cli/test_demo_leftovers.py",  # demo runs against a real Redis, interrupted
    "tests/test_bench_cli.py",
    "tests/run/test_run_restart.py",  # agents killed and restarted at once, copies racing
    "tests/chaos_transport/test_keyless_chaos.py",  # seeded fault plans, with and without guard
    "tests/cli/test_help.py",  # every command's help, each a run of the console script
    "tests/client/test_transport_failures.py",  # refusals, DNS, TLS, timeouts, with retries
    "tests/test_silent_library.py",  # programs run as processes, with and without logging
    "tests/proxy/test_proxy_real.py",  # node upstreams behind the proxy, children SIGKILLed
    "tests/proxy/test_proxy_fleet.py",  # proxy replicas behind nginx, replica and upstream killed
    "tests/proxy/test_proxy_http_upstream.py",  # an HTTP upstream killed and started again
    "tests/proxy/test_proxy_start.py",  # a proxy started before its upstream, then it
    "tests/proxy/test_stdio_front.py",  # the stdio front as a process, on both backends
    "tests/proxy/test_proxy_npm.py",  # the npm reference servers behind the proxy, lost answers
    "tests/proxy/test_proxy_intents.py",  # a guarded upstream behind the proxy, SIGKILLed
    "tests/proxy/test_proxy_desktop.py",  # real servers behind proxies started as a desktop app
    "tests/proxy/test_proxy_exit.py",  # the proxy stopped by EOF and signals, its child by pid
    "tests/proxy/test_proxy_wrap.py",  # desktop configs wrapped, each entry started as its client
    "tests/proxy/test_proxy_gateway.py",  # real upstreams behind one front, one killed, one missing
    "tests/proxy/test_proxy_gateway_fleet.py",  # gateway replicas behind nginx, an upstream killed
    "tests/proxy/test_proxy_tasks.py",  # a task-capable HTTP upstream, an agent SIGKILLed
    "tests/proxy/test_proxy_gateway_tasks.py",  # two task-capable HTTP upstreams, replicas
    "tests/server/test_reconcile_processes.py",  # payments servers killed mid-charge, restarted
    "tests/cli/test_demo_in_doubt.py",  # demo servers killed after paying, restarted
)

#: Test names that say they start and race or kill processes, or drive the console script.
SLOW_NAMES = re.compile(
    r"::test_\w*(?:processes|process_killed|console_script|stdio_clients|outage_longer_than)"
    r"|::test_backend_matches_the_reference_model\[(?!memory)"  # hypothesis, on real stores
)

#: Parameter ids naming a deployment or a subprocess transport.
SLOW_PARAMETERS = re.compile(
    r"\[(?:[^\]]*[-_])?(?:stdio|http|cluster|sentinel|tls|nginx|processes)\b"
)

FULL_FLAG = "--full"


def is_slow(item: pytest.Item) -> bool:
    if item.get_closest_marker("slow") is not None:
        return True
    if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    path = item.nodeid.split("::", 1)[0]
    if any(path.startswith(place) for place in SLOW_PLACES):
        return True
    return bool(SLOW_NAMES.search(item.nodeid) or SLOW_PARAMETERS.search(item.nodeid))


def split(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every slow item `slow`; without `--full` (or `-m` chosen by the caller), deselect
    them and say so in the header of the run."""
    slow = [item for item in items if is_slow(item)]
    for item in slow:
        item.add_marker(pytest.mark.slow)
    if config.getoption("full") or config.getoption("markexpr"):
        return
    chosen = {id(item) for item in slow}
    config.hook.pytest_deselected(items=slow)
    items[:] = [item for item in items if id(item) not in chosen]
    config.stash[DESELECTED] = len(slow)


DESELECTED = pytest.StashKey[int]()
#: The same count in an xdist worker's `workeroutput`, for the controller's summary.
DESELECTED_KEY = "mcp_once_slow_deselected"
