"""`mcp-once audit --follow` prints every event once, replay updates included, on every store.

A replay does not append a line to its record's history: it updates the replayed line in place
(its count and last time, rule 20). SQLite's audit table and one Redis's stream receive the
updated line as a new entry, so the follower prints a `replayed` entry per replay, with its count.
A Redis Cluster keeps no stream: the follower reads the histories themselves, where the update
replaces a line it has already printed, and where a history past its bound (`MAX_EVENTS`) drops
its oldest lines. Here a record is replayed time after time, and another passes its bound, while
the follower runs; each step waits until the follower has printed it (never a sleep to let it
settle), so the follower sees the history between any two steps, as one would between two
bursts of traffic, with other records' events in between. On the cluster, replays between two
looks show as one update carrying their count; the tests step one replay per look to compare the
three stores line for line.

The follower is the command's own action on its own parser's arguments, in this event loop (so
the test can stop it as Ctrl-C does), looking every 20 ms instead of every second.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli_run import private_redis_server

from idempotency import ClaimStatus, KeyStore, open_store
from idempotency._stores import history as chain
from mcp_once._cli import _audit, build_parser

pytestmark = pytest.mark.anyio

TOOL = "charge"
Entry = dict[str, Any]


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis-stream", marks=pytest.mark.redis),
        pytest.param("redis-cluster", marks=pytest.mark.redis),
    ]
)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """SQLite; one Redis polled through its histories (the default) and through its audit
    stream (`audit_stream=true`); a Redis Cluster (its histories)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'keys.db'}"
    elif request.param.startswith("redis") and request.param != "redis-cluster":
        stream = "?audit_stream=true" if request.param == "redis-stream" else ""
        for server in private_redis_server("audit --follow"):
            yield server.url + stream
    else:  # the session's cluster, shared: this test's own prefix
        url = request.getfixturevalue("redis_cluster_url")
        yield f"{url}?prefix={request.getfixturevalue('redis_namespace')}:"


class Follower:
    """`mcp-once audit --follow --json` running in a task, and what it has printed so far."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self._capsys = capsys
        self.printed: list[Entry] = []
        #: What the follower raised, if it did: shown by `until` (a task group would turn it
        #: into the test's cancellation and hide it).
        self.raised: BaseException | None = None

    async def run(self, store: KeyStore, args: Any) -> None:
        try:
            await _audit._audit(store, args)
        except Exception as exc:
            self.raised = exc

    async def until(self, wanted: Callable[[Entry], bool], what: str) -> None:
        """Until the follower (another task, on its own schedule) has printed `wanted`."""
        with anyio.move_on_after(30):
            while True:
                if self.raised is not None:
                    raise AssertionError(f"the follower raised before {what}") from self.raised
                out = self._capsys.readouterr().out
                self.printed.extend(json.loads(line) for line in out.splitlines())
                if any(wanted(entry) for entry in self.printed):
                    return
                await anyio.sleep(0.01)
        pytest.fail(f"the follower never printed {what}; it printed {self.story()}")

    def story(self, record: str | None = None) -> list[tuple[str, str, int, str | None]]:
        """(record, event, fence, count) of each printed entry, in the order printed."""
        return [
            (e["record"], e["event"], e["fence"], e.get("count"))
            for e in self.printed
            if record is None or e["record"] == record
        ]


@pytest.fixture
async def follower(
    store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Follower]:
    monkeypatch.setattr(_audit, "_FOLLOW_EVERY", 0.02)
    args = build_parser().parse_args(["audit", "--follow", "--json", "--store", store_url])
    store = open_store(store_url)
    following = Follower(capsys)
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(following.run, store, args)
            yield following
            group.cancel_scope.cancel()
    finally:
        await store.aclose()


@pytest.fixture
async def writer(store_url: str) -> AsyncIterator[KeyStore]:
    store = open_store(store_url)
    try:
        yield store
    finally:
        await store.aclose()


async def end_of_story(writer: KeyStore, follower: Follower) -> None:
    """A last event on another record, once printed: everything before it was looked at."""
    await writer.claim("the-end", "fp", lease=30, takeover=False, tool=TOOL)
    await follower.until(lambda e: e["record"] == "the-end", "the last event")


async def test_follow_prints_each_replay_with_its_count(
    writer: KeyStore, follower: Follower
) -> None:
    claimed = await writer.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
    assert claimed.token is not None
    assert await writer.complete("k", claimed.token, b"r", retention=600)
    await follower.until(lambda e: e["event"] == "completed", "the completion")
    replays = 4
    for count in range(1, replays + 1):
        replayed = await writer.claim("k", "fp", lease=30, takeover=False)
        assert replayed.status is ClaimStatus.REPLAY
        await follower.until(
            lambda e, n=str(count): e["event"] == "replayed" and e["count"] == n,
            f"replay {count}",
        )
        # Another record's event in between: the next update's line still has its first
        # time, older than this event, and must be printed all the same.
        await writer.claim(f"other-{count}", "fp", lease=30, takeover=False, tool=TOOL)
        await follower.until(lambda e, n=count: e["record"] == f"other-{n}", "another record")
    await end_of_story(writer, follower)
    assert follower.story("k") == [
        ("k", "claimed", 1, None),
        ("k", "completed", 1, None),
        *[("k", "replayed", 1, str(n)) for n in range(1, replays + 1)],
    ]
    assert len({e["id"] for e in follower.printed}) == len(follower.printed)


async def test_follow_prints_every_event_once_while_a_history_passes_its_bound(
    writer: KeyStore, follower: Follower
) -> None:
    """Claimed and released, time after time: more events than a history keeps, its oldest
    dropped and the rest moved up while the follower reads it. Each burst stays well within
    the bound, so every event is there to be seen at some look."""
    cycles, per_burst = chain.MAX_EVENTS // 2 + 8, 6
    assert 2 * per_burst < chain.MAX_EVENTS
    for fence in range(1, cycles + 1):
        claimed = await writer.claim("k", "fp", lease=30, takeover=False, tool=TOOL)
        assert claimed.token is not None and claimed.fence == fence
        assert await writer.release("k", claimed.token)
        if fence % per_burst == 0 or fence == cycles:
            await follower.until(
                lambda e, f=fence: e["event"] == "released" and e["fence"] == f,
                f"the release of fence {fence}",
            )
    await end_of_story(writer, follower)
    expected = [("k", kind, f, None) for f in range(1, cycles + 1) for kind in _CYCLE]
    assert len(expected) > chain.MAX_EVENTS
    assert follower.story("k") == expected


_CYCLE = ("claimed", "released")
