"""Issue 48: with an audit key, a history's links are MACs and its seal pins its count and newest
digest, so an edit with a recomputed chain and a cut are caught, and the audit stream names a
deleted history; without the key the weaker promise holds (an edit is caught). On memory, SQLite
and Redis, each writing through its own code (Redis: `scripts/lib.lua`), each read by the one
checker (`check_history`, `compare_audit_stream`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from history_tamper import Raw, cut, edited, events_of, recomputed, unsealed
from store_backends import sync_redis_client

from idempotency import (
    AuditedStore,
    AuditKey,
    MemoryKeyStore,
    RedisKeyStore,
    SQLiteKeyStore,
    check_history,
    compare_audit_stream,
    open_store,
    parse_history,
    verify_history,
)
from idempotency._stores import audit_key as audit_keys
from idempotency._stores import history as chain

pytestmark = pytest.mark.anyio

KEY = "audit-key-for-the-tests-4e7a1c"
OTHER = "another-audit-key-for-tests-9b2"
TOOL = "charge"
BACKENDS = ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]


@dataclass
class Opened:
    """A store (with or without the key), and its histories reached around it."""

    name: str
    store: Any
    raw: Raw
    #: Another store over the same data, with the audit key given (None: plain digests).
    reopen: Any

    @property
    def audited(self) -> AuditedStore:
        assert isinstance(self.store, AuditedStore)
        return self.store

    async def history(self, record: str = "k") -> str:
        text = await self.audited.history(record)
        assert text is not None
        return text


@pytest.fixture(params=BACKENDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def opener(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """Opens stores of one backend over one set of data, with the audit key given or not."""
    made: list[Any] = []
    url = request.getfixturevalue("redis_url") if kind == "redis" else ""
    prefix = f"{request.getfixturevalue('redis_namespace')}:" if kind == "redis" else ""
    memory: list[MemoryKeyStore] = []

    def open_one(key: str | None) -> Any:
        if kind == "memory":
            store: Any = MemoryKeyStore(audit_key=key)
            if memory:  # one process: the second store is the first, given the key
                memory[0].audit_key = store.audit_key
                assert memory[0]._trail is not None
                memory[0]._trail.audit_key = store.audit_key
                return memory[0]
            memory.append(store)
        elif kind == "sqlite":
            store = SQLiteKeyStore(tmp_path / "keys.db", audit_key=key)
        else:
            # with the audit stream, which `compare_audit_stream` checks the histories against
            store = RedisKeyStore.from_url(url, prefix=prefix, audit_key=key, audit_stream=True)
        made.append(store)
        return store

    def opened(key: str | None) -> Opened:
        store = open_one(key)
        location = url if kind == "redis" else str(tmp_path / "keys.db")
        return Opened(kind, store, Raw(store, location, prefix), open_one)

    yield opened
    for store in made:
        await store.aclose()


@pytest.fixture
def keyed(opener: Any) -> Opened:
    return opener(KEY)  # type: ignore[no-any-return]


@pytest.fixture
def plain(opener: Any) -> Opened:
    return opener(None)  # type: ignore[no-any-return]


async def story(store: Any, record: str = "k") -> None:
    """claimed, completed (10 bytes), replayed twice (one counted line), refused."""
    claimed = await store.claim(record, "fp", lease=30, takeover=False, tool=TOOL)
    assert claimed.token is not None
    assert await store.complete(record, claimed.token, b"r" * 10, retention=600)
    for _ in range(2):
        await store.claim(record, "fp", lease=30, takeover=False)
    await store.claim(record, "other", lease=30, takeover=False)


def checked(opened: Opened, text: str, key: str | None = KEY, record: str = "k") -> Any:
    return check_history(text, record=record, key=None if key is None else AuditKey(key.encode()))


async def test_a_keyed_history_holds_with_its_key_and_is_unchecked_without(keyed: Opened) -> None:
    await story(keyed.store)
    text = await keyed.history()
    assert [e.kind for e in parse_history(text)] == ["claimed", "completed", "replayed", "refused"]
    assert text.startswith(f"#{keyed.store.audit_key.id}|4|0|")  # the seal: 4 events, 0 adopted
    found = checked(keyed, text)
    assert (found.status, found.problem, found.verified) == ("ok", None, (True,) * 4)
    without = checked(keyed, text, key=None)
    assert without.status == "unchecked" and without.verified == (None,) * 4
    assert f"sealed with audit key {keyed.store.audit_key.id}" in str(without.problem)
    other = checked(keyed, text, key=OTHER)
    assert other.status == "broken" and "not with this one" in str(other.problem)
    # Another record's history (its own key) does not verify as this one's.
    assert checked(keyed, text, record="k2").status == "broken"
    # The key is in no history, no stream entry, no stored byte.
    for stored in [text, *(e.event.line for e in await keyed.audited.audit())]:
        assert KEY not in stored


async def test_with_the_key_an_edited_byte_is_named(keyed: Opened) -> None:
    await story(keyed.store)
    keyed.raw.set("k", edited(await keyed.history(), 1, "s=10", "s=11"))
    found = checked(keyed, await keyed.history())
    assert found.status == "broken"
    assert str(found.problem).startswith("event 1 (completed"), found.problem
    assert "does not match its MAC" in str(found.problem)
    assert found.verified == (True, False, False, False)


@pytest.mark.parametrize("how", ["plain", "guessed key", "plain, seal dropped"])
async def test_with_the_key_a_chain_recomputed_without_it_is_named(keyed: Opened, how: str) -> None:
    await story(keyed.store)
    text = await keyed.history()
    guess = AuditKey(b"a-guess-at-the-audit-key") if how == "guessed key" else None
    forged = recomputed(text, 1, "s=10", "s=99", guess=guess)
    if how.endswith("seal dropped"):
        forged = unsealed(forged)
    if guess is None:
        assert verify_history(unsealed(forged)) is None  # a plain chain that holds
    keyed.raw.set("k", forged)
    found = checked(keyed, await keyed.history())
    if how.endswith("seal dropped"):
        # Indistinguishable from a history written before the key: never vouched for.
        assert found.status == "unsealed", found
        assert found.verified == (False,) * 4
    else:
        assert found.status == "broken", found
        assert str(found.problem).startswith("event 0 (claimed"), found.problem
        assert "does not match its MAC" in str(found.problem)


@pytest.mark.parametrize("how", ["newest", "newest, seal dropped", "oldest"])
async def test_with_the_key_a_cut_history_is_named_and_stays_named(keyed: Opened, how: str) -> None:
    await story(keyed.store)
    text = await keyed.history()
    shorter = cut(text, oldest=1) if how == "oldest" else cut(text, newest=1)
    if how.endswith("seal dropped"):
        shorter = unsealed(shorter)
    keyed.raw.set("k", shorter)
    found = checked(keyed, await keyed.history())
    assert found.status == "broken", found
    if how.endswith("seal dropped"):
        assert "its seal was removed" in str(found.problem)
    else:
        assert "its seal says it holds 4 events, and it holds 3" in str(found.problem)
    if how == "newest":
        # The server writes on (another refusal): the seal carries the count over, never
        # recounts it, so the cut is not made good.
        await keyed.store.claim("k", "third", lease=30, takeover=False)
        after = await keyed.history()
        assert len(events_of(after)) == 4
        assert "its seal says it holds 5 events, and it holds 4" in str(
            checked(keyed, after).problem
        )


async def test_without_the_key_an_edit_is_caught_and_a_recomputed_or_cut_chain_is_not(
    plain: Opened,
) -> None:
    """The weaker promise, as the docs state it: a plain chain catches an edit, not a rewrite."""
    await story(plain.store)
    text = await plain.history()
    assert not text.startswith("#")  # no seal without a key: the format as before
    assert check_history(text).status == "ok"
    problem = verify_history(edited(text, 1, "s=10", "s=11"))
    assert problem is not None and problem.startswith("event 1 (completed"), problem
    assert verify_history(recomputed(text, 1, "s=10", "s=99")) is None
    assert verify_history(cut(text, newest=2)) is None


async def test_the_audit_stream_names_a_deleted_history_and_a_cut_one(opener: Any) -> None:
    for key in (None, KEY):
        opened = opener(key)
        tag = "keyed" if key else "plain"
        await story(opened.store, f"{tag}-deleted")
        await story(opened.store, f"{tag}-cut")
        await story(opened.store, f"{tag}-kept")
        opened.raw.delete(f"{tag}-deleted")
        opened.raw.set(f"{tag}-cut", cut(opened.raw.get(f"{tag}-cut"), newest=1))
    stream = await opened.audited.audit(limit=100_000)
    histories = dict(await opened.audited.histories())
    stored = {found.key for found in stream}  # every record is still stored
    named = dict(compare_audit_stream(stream, histories, stored=stored))
    assert set(named) == {"plain-deleted", "plain-cut", "keyed-deleted", "keyed-cut"}, named
    assert "its history is gone" in named["plain-deleted"] and "deleted" in named["plain-deleted"]
    assert "is not in its history" in named["keyed-cut"]
    # A history gone with its record (rule 24) is not taken for a deleted one.
    gone = stored - {"plain-deleted"}
    assert "plain-deleted" not in dict(compare_audit_stream(stream, histories, stored=gone))
    # Replays counted after the stream was read are a later count of the same event.
    await opened.store.claim("keyed-kept", "other", lease=30, takeover=False)
    fresh = dict(await opened.audited.histories())
    assert "keyed-kept" not in dict(compare_audit_stream(stream, fresh, stored=stored))


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def test_an_unkeyed_history_reads_as_unsealed_and_a_keyed_writer_adopts_it(
    plain: Opened,
) -> None:
    """A history written before the key (this release without one, or the one before) verifies
    as before without the key; with it, it is not vouched for, and once a keyed writer adds to
    it the seal names the lines it adopted, until the bound drops them."""
    await story(plain.store)
    old = await plain.history()
    assert check_history(old).status == "ok"
    assert checked(plain, old).status == "unsealed"
    keyed = plain.reopen(KEY)
    replayed = await keyed.claim("k", "fp", lease=30, takeover=False)  # a line of its own
    assert replayed.token is None and replayed.result == b"r" * 10
    text = await plain.history()
    assert text.startswith(f"#{keyed.audit_key.id}|5|4|")  # 5 events, the first 4 adopted
    found = checked(plain, text)
    assert found.status == "unsealed"
    assert "its first 4 of 5 events were written without the audit key" in str(found.problem)
    assert found.verified == (False,) * 4 + (True,)
    plain.raw.set("k", edited(text, 1, "s=10", "s=11"))  # the adopted part is still a chain
    assert checked(plain, await plain.history()).status == "broken"
    plain.raw.set("k", text)
    for n in range(chain.MAX_EVENTS // 2):  # a refusal, a replay: a line each
        await keyed.claim("k", f"fp-{n}", lease=30, takeover=False)
        await keyed.claim("k", "fp", lease=30, takeover=False)
    found = checked(plain, await plain.history())
    assert (found.status, found.verified) == ("ok", (True,) * chain.MAX_EVENTS)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def test_a_writer_without_the_key_leaves_the_seal_behind(keyed: Opened) -> None:
    """A server configured without the key, sharing the store: its events break the seal
    (caught, as any unkeyed append must be), and the history stays readable."""
    await story(keyed.store)
    unkeyed = keyed.reopen(None)
    await unkeyed.claim("k", "other", lease=30, takeover=False)  # counted: replaces the last line
    text = await keyed.history()
    assert parse_history(text)[-1].details["count"] == "2"
    found = checked(keyed, text)
    assert found.status == "broken" and "event 3 (refused" in str(found.problem), found


# -- where the key comes from --------------------------------------------------------------------


async def test_the_key_comes_from_the_store_option_the_environment_or_a_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(audit_keys.KEY_VARIABLE, raising=False)
    monkeypatch.delenv(audit_keys.KEY_FILE_VARIABLE, raising=False)
    assert MemoryKeyStore().audit_key is None
    given = MemoryKeyStore(audit_key=KEY).audit_key
    assert given is not None
    monkeypatch.setenv(audit_keys.KEY_VARIABLE, KEY)
    assert MemoryKeyStore().audit_key == given
    monkeypatch.delenv(audit_keys.KEY_VARIABLE)
    path = tmp_path / "audit.key"
    path.write_text(KEY + "\n")
    assert MemoryKeyStore(audit_key_file=path).audit_key == given
    monkeypatch.setenv(audit_keys.KEY_FILE_VARIABLE, str(path))
    assert MemoryKeyStore().audit_key == given
    url = f"sqlite:///{tmp_path / 'k.db'}"
    for store in (
        open_store(f"{url}?audit_key={KEY}"),
        open_store(f"{url}?audit_key_file={path}"),
        open_store(f"redis://127.0.0.1:1/0?audit_key_file={path}"),  # connects lazily
    ):
        assert getattr(store, "audit_key", None) == given
        assert KEY not in repr(store) and KEY not in repr(given)
        await store.aclose()


@pytest.mark.parametrize(
    ("options", "environment", "said"),
    [
        ({"audit_key": "short"}, {}, "shorter than 16 bytes"),
        ({"audit_key": KEY, "audit_key_file": "/x"}, {}, "not both"),
        ({"audit_key_file": "/no/such/audit.key"}, {}, "cannot read the audit key file"),
        ({}, {"MCP_ONCE_AUDIT_KEY": "short"}, "from $MCP_ONCE_AUDIT_KEY is shorter"),
        ({}, {"MCP_ONCE_AUDIT_KEY": KEY, "MCP_ONCE_AUDIT_KEY_FILE": "/x"}, "are set: set one"),
    ],
)
def test_a_bad_audit_key_is_refused_without_quoting_it(
    monkeypatch: pytest.MonkeyPatch,
    options: dict[str, str],
    environment: dict[str, str],
    said: str,
) -> None:
    monkeypatch.delenv(audit_keys.KEY_VARIABLE, raising=False)
    monkeypatch.delenv(audit_keys.KEY_FILE_VARIABLE, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="audit key") as raised:
        MemoryKeyStore(**options)  # type: ignore[arg-type]
    assert said in str(raised.value)
    assert "short" not in str(raised.value).replace("shorter", "")
    with pytest.raises(ValueError) as from_url:
        query = "&".join(f"{k}={v}" for k, v in options.items())
        open_store(f"sqlite:///unused.db?{query}" if query else "sqlite:///unused.db")
    assert said in str(from_url.value)


def test_checking_with_a_key_needs_the_record() -> None:
    with pytest.raises(ValueError, match="store key"):
        check_history("", key=AuditKey(KEY.encode()))


# -- the script's share of the key ---------------------------------------------------------------


@pytest.mark.redis
async def test_redis_is_given_each_records_own_key_never_the_audit_key(
    redis_url: str, redis_namespace: str
) -> None:
    """What reaches Redis (MONITOR shows a script's arguments) is the record's history key in
    HMAC's padded form: the audit key is in no argument, and one record's is not another's."""
    store = RedisKeyStore.from_url(redis_url, prefix=f"{redis_namespace}:", audit_key=KEY)
    try:
        first = store._trailer(store._rkey("k"), "")[-1]
        second = store._trailer(store._rkey("k2"), "")[-1]
        assert KEY.encode() not in first and first != second and len(first) == 136
        await story(store)
        with sync_redis_client(redis_url) as client:
            for name in client.scan_iter(match=f"{redis_namespace}:*"):
                kind = client.type(name)
                if kind == b"stream":
                    stored = repr(client.xrange(name))
                elif kind == b"hash":  # the store's mark
                    stored = repr(client.hgetall(name))
                elif kind == b"set":  # the in-doubt index
                    stored = repr(client.smembers(name))
                else:
                    stored = repr(client.get(name))
                assert KEY not in stored
    finally:
        await store.aclose()
