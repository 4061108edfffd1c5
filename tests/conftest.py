"""Shared fixtures. Redis is real: started here on a free loopback port, or taken from REDIS_URL.

Without a server the Redis tests skip with a loud reason, except under CI (CI=true), where a
missing Redis is a failure: a green CI must mean the Redis half was tested.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from redis_cluster import LocalCluster, missing_binaries
from redis_sentinel import RedisSentinel
from redis_server import RedisServer, redis_server_binary
from redis_tls import TLSFiles, make_certificates, openssl_binary
from tiers import DESELECTED, DESELECTED_KEY, FULL_FLAG, split
from unavailable import unavailable

# What a proxy or server started by a test keeps in the user's state folder (default stores,
# manifests, the proxy's replay files) goes to a folder of this test process's own instead: a
# run neither reads what an earlier run left there (a replay file recorded by another run's
# proxy) nor leaves thousands of files behind. Started processes inherit it; a test that needs
# another sets XDG_STATE_HOME (or HOME, deleting this) itself.
_STATE_HOME = tempfile.mkdtemp(prefix="mcp-once-tests-state-")
os.environ["XDG_STATE_HOME"] = _STATE_HOME
atexit.register(shutil.rmtree, _STATE_HOME, True)

# -- tiers (tests/tiers.py) --------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        FULL_FLAG,
        action="store_true",
        dest="full",
        help="run the slow tier too (Cluster, Sentinel, TLS, nginx, failover, soak, engines,"
        " examples): what .ci/run runs",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    split(config, items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker hands its count of slow tests left out to the controller, which prints."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[DESELECTED_KEY] = session.config.stash.get(DESELECTED, 0)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """xdist's controller: every worker collects the same tests, so any worker's count is the
    run's."""
    workeroutput = getattr(node, "workeroutput", {})
    if DESELECTED_KEY in workeroutput:
        config: pytest.Config = node.config  # type: ignore[attr-defined]
        config.stash[DESELECTED] = workeroutput[DESELECTED_KEY]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    deselected = terminalreporter.config.stash.get(DESELECTED, 0)
    if deselected:
        terminalreporter.write_line(
            f"fast tier: {deselected} slow tests not run; `uv run pytest {FULL_FLAG}` runs all"
        )


# -- what was running when the run was interrupted (.ci/run's overall timeout) -----------------

#: Tests started and not yet finished, as the process that reports them sees them (xdist's
#: controller hears each worker's start and finish).
_RUNNING: dict[str, None] = {}


def pytest_runtest_logstart(nodeid: str) -> None:
    _RUNNING[nodeid] = None


def pytest_runtest_logfinish(nodeid: str) -> None:
    _RUNNING.pop(nodeid, None)


def pytest_keyboard_interrupt() -> None:
    """Name the tests an interrupt (`.ci/run`'s overall timeout sends SIGINT) found running: a
    test's own deadline (pyproject's `timeout`) names a hang, this names what a run too slow
    as a whole was doing."""
    for nodeid in _RUNNING:  # on a line of its own: the progress dots have no newline
        print(f"\nINTERRUPTED while running {nodeid}", file=sys.stderr)


def _no_redis(reason: str) -> NoReturn:
    unavailable(f"REDIS NOT AVAILABLE — Redis tests cannot run: {reason}", "Redis")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis URL for the whole session: REDIS_URL, or a private redis-server we start."""
    env_url = os.environ.get("REDIS_URL")
    if env_url:
        yield env_url
        return
    if redis_server_binary() is None:
        _no_redis("redis-server is not on PATH and REDIS_URL is not set")
    server = RedisServer()
    try:
        server.start()
    except Exception as exc:  # a broken install must still say why
        server.cleanup()
        _no_redis(f"could not start redis-server: {exc!r}")
    yield server.url
    server.cleanup()


def start_cluster(replicas_per_master: int = 1, tls: TLSFiles | None = None) -> LocalCluster:
    """A started `LocalCluster` of 3 masters; skips loudly (fails under CI) when it cannot be
    started. The caller cleans it up."""
    missing = missing_binaries()
    if missing:
        _no_redis(f"{', '.join(missing)} not on PATH, so no Redis Cluster can be started")
    cluster = LocalCluster(replicas_per_master=replicas_per_master, tls=tls)
    try:
        cluster.start()
    except Exception as exc:  # start() cleans up after itself
        kind = "a TLS Redis Cluster" if tls is not None else "a Redis Cluster"
        _no_redis(f"could not start {kind}: {exc!r}")
    return cluster


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A private Redis Cluster for the whole session: 3 masters and 3 replicas on loopback
    ports. Tests that reshard or kill nodes must leave it healthy (`wait_healthy`)."""
    cluster = start_cluster()
    yield cluster
    cluster.cleanup()


@pytest.fixture(scope="session")
def redis_cluster_url(redis_cluster: LocalCluster) -> str:
    return redis_cluster.url


def start_sentinel_deployment(tls: TLSFiles | None = None) -> RedisSentinel:
    """A fresh 1 primary + 2 replicas + 3 Sentinels on loopback (`tests/redis_sentinel.py`),
    TLS-only with `tls`; skips loudly (fails under CI) when it cannot be started. The caller
    cleans it up."""
    if redis_server_binary() is None:
        _no_redis("redis-server is not on PATH, so no Sentinel deployment can be started")
    deployment = RedisSentinel(tls=tls)
    try:
        deployment.start()
    except Exception as exc:  # start() already cleaned up what it had started
        _no_redis(f"could not start the Sentinel deployment: {exc!r}")
    return deployment


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[RedisSentinel]:
    """One Sentinel deployment for the whole session; tests that kill its primary must start
    their own (`start_sentinel_deployment`), so that this one stays as every test expects."""
    deployment = start_sentinel_deployment()
    yield deployment
    deployment.cleanup()


@pytest.fixture
def fresh_sentinel() -> Iterator[RedisSentinel]:
    """A Sentinel deployment of this test's own, for tests that crash its primary."""
    deployment = start_sentinel_deployment()
    yield deployment
    deployment.cleanup()


@pytest.fixture(scope="session")
def redis_sentinel_url(redis_sentinel: RedisSentinel) -> str:
    """`redis+sentinel://` URL of the session's Sentinel deployment."""
    return redis_sentinel.url


# -- TLS (certificates made at test time) --------------------------------------------------------


@pytest.fixture(scope="session")
def redis_tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """A CA, a certificate for 127.0.0.1 it signed (servers and clients use it) and a CA that
    signed nothing, made with `openssl` for this session."""
    if openssl_binary() is None:
        _no_redis("openssl is not on PATH, so no TLS certificates can be made")
    try:
        return make_certificates(tmp_path_factory.mktemp("tls"))
    except Exception as exc:  # a broken openssl must still say why
        _no_redis(f"could not make TLS certificates: {exc!r}")


@pytest.fixture(scope="session")
def redis_tls_cluster(redis_tls_files: TLSFiles) -> Iterator[LocalCluster]:
    """A TLS-only Redis Cluster: 3 masters, no replicas, cluster bus over TLS."""
    cluster = start_cluster(replicas_per_master=0, tls=redis_tls_files)
    yield cluster
    cluster.cleanup()


@pytest.fixture(scope="session")
def redis_tls_sentinel(redis_tls_files: TLSFiles) -> Iterator[RedisSentinel]:
    """A TLS-only Sentinel deployment (1 primary, 2 replicas, 3 Sentinels) for the session."""
    deployment = start_sentinel_deployment(redis_tls_files)
    yield deployment
    deployment.cleanup()


@pytest.fixture
def fresh_tls_sentinel(redis_tls_files: TLSFiles) -> Iterator[RedisSentinel]:
    """A TLS-only Sentinel deployment of this test's own, for tests that crash its primary."""
    deployment = start_sentinel_deployment(redis_tls_files)
    yield deployment
    deployment.cleanup()


@pytest.fixture
def redis_namespace() -> str:
    """A prefix unique to one test, so tests sharing one server never see each other's keys."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- nginx (the load-balancer tests) -----------------------------------------------------------


@pytest.fixture(scope="session")
def nginx_binary() -> str:
    """Debian's nginx, for the tests that put a real load balancer in front of replicas. Missing,
    they skip with a loud reason; under CI a skip is a failure, as for Redis."""
    from nginx_server import nginx_binary as find_nginx

    found = find_nginx()
    if found is None:
        unavailable(
            "NGINX NOT AVAILABLE — load-balancer tests cannot run: nginx is not installed", "nginx"
        )
    return found
