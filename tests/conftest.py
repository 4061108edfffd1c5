"""Shared fixtures. Redis is real: started here on a free loopback port, or taken from REDIS_URL.

Without a server the Redis tests skip with a loud reason, except under CI (CI=true), where a
missing Redis is a failure: a green CI must mean the Redis half was tested.
"""

from __future__ import annotations

import os
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from redis_cluster import LocalCluster, missing_binaries
from redis_sentinel import RedisSentinel
from redis_server import RedisServer, redis_server_binary

UNDER_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _no_redis(reason: str) -> None:
    message = f"REDIS NOT AVAILABLE — Redis tests cannot run: {reason}"
    if UNDER_CI:
        pytest.fail(message + " (under CI a missing Redis is a failure)", pytrace=False)
    warnings.warn(message, stacklevel=2)
    pytest.skip(message)


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


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A private Redis Cluster for the whole session: 3 masters and 3 replicas on loopback
    ports. Tests that reshard or kill nodes must leave it healthy (`wait_healthy`)."""
    missing = missing_binaries()
    if missing:
        _no_redis(f"{', '.join(missing)} not on PATH, so no Redis Cluster can be started")
    cluster = LocalCluster()
    try:
        cluster.start()
    except Exception as exc:  # start() cleans up after itself
        _no_redis(f"could not start a Redis Cluster: {exc!r}")
    yield cluster
    cluster.cleanup()


@pytest.fixture(scope="session")
def redis_cluster_url(redis_cluster: LocalCluster) -> str:
    return redis_cluster.url


def start_sentinel_deployment() -> RedisSentinel:
    """A fresh 1 primary + 2 replicas + 3 Sentinels on loopback (`tests/redis_sentinel.py`);
    skips loudly (fails under CI) when it cannot be started. The caller cleans it up."""
    if redis_server_binary() is None:
        _no_redis("redis-server is not on PATH, so no Sentinel deployment can be started")
    deployment = RedisSentinel()
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
        message = "NGINX NOT AVAILABLE — load-balancer tests cannot run: nginx is not installed"
        if UNDER_CI:
            pytest.fail(message + " (under CI a missing nginx is a failure)", pytrace=False)
        warnings.warn(message, stacklevel=2)
        pytest.skip(message)
    return found
