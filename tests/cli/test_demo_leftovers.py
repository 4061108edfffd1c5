"""`mcp-once demo --store redis://…` leaves the user's Redis exactly as it found it: the demo
writes under a prefix of its own and deletes every key under it when it ends, after a normal
run and after Ctrl-C or SIGTERM. The Redis holds unrelated keys before (one of them under the
store's default prefix, as a real deployment's record would be): each must be there after,
unchanged (type, value, TTL), and nothing else."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from cli_run import private_redis_server
from redis_server import RedisServer

pytestmark = pytest.mark.redis

SCRIPT = str(Path(sys.executable).with_name("mcp-once"))


@pytest.fixture
def users_redis() -> Iterator[tuple[RedisServer, redis.Redis]]:
    for server in private_redis_server("demo leftovers"):
        client = redis.Redis.from_url(server.url)
        client.set("user:1", "alice")
        client.set("session:9", "x", ex=3600)
        client.hset("mcp-once:{a-real-record}", "v", "1")  # the default prefix: not the demo's
        client.set("app:{k}", "theirs")  # under the prefix a URL below names
        yield server, client
        client.close()


def snapshot(client: redis.Redis) -> tuple[int, dict[bytes, Any]]:
    keys = sorted(client.keys("*"))
    return client.dbsize(), {k: (client.type(k), client.dump(k), client.ttl(k) > 0) for k in keys}


@pytest.mark.parametrize("query", ["", "?prefix=app%3A"])
def test_a_demo_run_leaves_the_target_as_it_found_it(
    users_redis: tuple[RedisServer, redis.Redis], query: str
) -> None:
    server, client = users_redis
    before = snapshot(client)
    assert before[0] == 4
    ran = subprocess.run(
        [
            SCRIPT,
            "demo",
            "--json",
            "--calls",
            "20",
            "--pipelines",
            "0",
            "--store",
            server.url + query,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    data = json.loads(ran.stdout)
    # It did write there (so the comparison below means something), under its own prefix...
    assert data["demo_records_removed"] > 0 and data["replays"] > 0
    expected = "app:demo-" if query else "mcp-once-demo:"
    assert f"?prefix={expected}" in data["store"]
    # ...and removed exactly that.
    assert snapshot(client) == before


@pytest.mark.parametrize(
    ("stop", "status", "said"),
    [(signal.SIGINT, 130, "demo interrupted"), (signal.SIGTERM, 143, "demo terminated")],
    ids=["ctrl-c", "sigterm"],
)
def test_stopping_mid_run_still_removes_what_it_wrote(
    users_redis: tuple[RedisServer, redis.Redis], stop: signal.Signals, status: int, said: str
) -> None:
    server, client = users_redis
    before = snapshot(client)
    client.config_set("notify-keyspace-events", "K$h")  # tell us when the demo writes
    events = client.pubsub()
    events.psubscribe("__keyspace@0__:mcp-once-demo:*")
    assert events.get_message(timeout=10)["type"] == "psubscribe"
    demo = subprocess.Popen(
        [SCRIPT, "demo", "--calls", "300", "--pipelines", "0", "--store", server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The naive half (no keys, nothing stored) runs first: its 300 calls take a few seconds.
        written = events.get_message(timeout=120)
        assert written is not None and written["type"] == "pmessage", "the demo never wrote"
        assert client.dbsize() > before[0]
        demo.send_signal(stop)
        _, err = demo.communicate(timeout=120)
    finally:
        events.close()
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == status, err[-2000:]
    assert said in err and "Traceback" not in err
    assert "removed the demo's" in err
    assert snapshot(client) == before
