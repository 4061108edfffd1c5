"""`--store` and `$MCP_ONCE_STORE` carry the store's options in the URL query, end to end
through `mcp-once keys`: `?wait_replicas=1` opens (it failed inside redis-py before), `?prefix=`
really selects the records the command sees, and a bad option names itself (exit 2)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cli_run import cli, private_redis_server, sync_cli
from redis_server import RedisServer

from idempotency import RedisKeyStore

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

KEY = "a" * 64


@pytest.fixture(scope="module")
def private_redis() -> Iterator[RedisServer]:
    yield from private_redis_server("store URL CLI")


async def test_options_in_the_store_url_apply(
    private_redis: RedisServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = private_redis.url
    writer = RedisKeyStore.from_url(url, prefix="elsewhere:")
    await writer.claim(KEY, "fp", lease=3600, takeover=False)
    await writer.aclose()

    durable = await cli(capsys, "keys", "list", "--json", "--store", f"{url}?wait_replicas=1")
    assert durable.code == 3  # the default prefix holds nothing of mcp-once's
    assert "(prefix 'mcp-once:'): is this the right --store?" in durable.err
    prefixed = f"{url}?prefix=elsewhere%3A&wait_replicas=1&wait_aof=false&wait_timeout=0.5"
    found = await cli(capsys, "keys", "list", "--json", "--store", prefixed)
    assert found.code == 0 and [row["key"] for row in found.json()] == [KEY]

    monkeypatch.setenv("MCP_ONCE_STORE", prefixed)  # the environment carries them as well
    shown = await cli(capsys, "keys", "show", KEY, "--json")
    assert shown.code == 0 and shown.json()["state"] == "in_progress"


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("wait_replicas=one", "wait_replicas='one': expected an integer"),
        ("wait_replica=1", "unknown key store URL option 'wait_replica'"),
        ("wait_aof=maybe", "wait_aof='maybe': expected true or false"),
    ],
)
def test_a_bad_option_exits_2_naming_itself(
    query: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"redis://:s3cret@127.0.0.1:1/0?{query}"
    ran = sync_cli(capsys, "keys", "list", "--store", url)
    assert ran.code == 2 and ran.out == ""
    assert ran.err.startswith("mcp-once: bad key store URL:") and why in ran.err
    assert "s3cret" not in ran.err
