"""Issue 48: `mcp-once audit verify` and `keys history` with the audit key and without it, on the
SQLite and Redis stores a real guarded tool wrote. `$MCP_ONCE_AUDIT_KEY` configures the server's
store and the CLI alike.

The one who tampers can write the store (histories and the audit stream) but holds no key
(`history_tamper.py`): with the key, an edit, a chain recomputed after one, a cut and a deleted
history are each named; without it, an edit and a deleted history are, and a rewrite that also
forged the stream is not (the weaker promise the docs state). The memory store, one process, is
not reachable from a command: `tests/store/test_history_key.py` checks it with the same functions.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cli_run import cli
from history_tamper import Raw, cut, edited, events_of, recomputed
from test_audit import record_of
from test_audit_otel import charge

from idempotency import AuditKey
from idempotency._stores.audit_key import KEY_FILE_VARIABLE, KEY_VARIABLE

pytestmark = pytest.mark.anyio

KEY = "audit-key-for-the-cli-tests-51f0"
KEY_ID = AuditKey(KEY.encode()).id


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLite file, or this test's own prefix on the session's Redis, keeping the audit
    stream (`audit_stream=true`: off by default) that verify compares the histories with."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'keys.db'}"
    prefix = f"prefix={request.getfixturevalue('redis_namespace')}:"
    return f"{request.getfixturevalue('redis_url')}?audit_stream=true&{prefix}"


@pytest.fixture(autouse=True)
def no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    monkeypatch.delenv(KEY_FILE_VARIABLE, raising=False)


def raw(url: str) -> Raw:
    if url.startswith("sqlite:///"):
        return Raw(None, url.removeprefix("sqlite:///"))
    location, _, prefix = url.partition("?audit_stream=true&prefix=")
    return Raw(None, location, prefix)


def order(n: int) -> str:
    return record_of("charge", f"order-{n}")


def forge_newest(histories: Raw, record: str) -> None:
    """Make the audit stream agree with a rewritten history: its newest line appended."""
    histories.forge_stream(record, "charge", events_of(histories.get(record))[-1], time.time())


async def test_with_the_key_verify_names_an_edit_a_recomputed_chain_a_cut_and_a_deleted_history(
    store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    await charge(store_url, range(1, 6))  # each: claimed, completed, replayed
    ok = await cli(capsys, "audit", "verify", "--store", store_url)
    assert ok.code == 0, ok.err
    assert "verified 5 histories (15 events): every chain holds" in ok.out
    assert f"MACed with audit key {KEY_ID}" in ok.out
    histories = raw(store_url)
    histories.set(order(1), edited(histories.get(order(1)), 1, "s=", "s=1"))
    histories.set(order(2), recomputed(histories.get(order(2)), 1, "s=", "s=1"))
    forge_newest(histories, order(2))
    histories.set(order(3), cut(histories.get(order(3)), newest=1))
    forge_newest(histories, order(3))
    histories.delete(order(4))
    ran = await cli(capsys, "audit", "verify", "--store", store_url)
    assert ran.code == 1, ran.out
    named = {
        line.split()[2].rstrip(":"): line
        for line in ran.err.splitlines()
        if line.startswith("mcp-once: record ")
    }
    assert set(named) == {order(1), order(2), order(3), order(4)}, ran.err
    assert "event 1 (completed" in named[order(1)] and "does not match its MAC" in named[order(1)]
    assert "event 0 (claimed" in named[order(2)] and "does not match its MAC" in named[order(2)]
    assert "its seal says it holds 3 events, and it holds 2" in named[order(3)]
    assert "its history is gone" in named[order(4)] and "deleted" in named[order(4)]
    assert "4 histories are broken or disagree with the audit stream" in ran.err


async def test_without_the_key_an_edit_is_caught_and_a_rewrite_with_a_forged_stream_is_not(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The weaker promise, exactly: no key, no seal, a plain chain and the stream."""
    await charge(store_url, range(1, 6))
    histories = raw(store_url)
    assert not histories.get(order(1)).startswith("#")  # written as before: no seal
    histories.set(order(1), edited(histories.get(order(1)), 1, "s=", "s=1"))
    histories.set(order(2), recomputed(histories.get(order(2)), 1, "s=", "s=1"))
    forge_newest(histories, order(2))
    histories.delete(order(3))
    histories.set(order(4), cut(histories.get(order(4)), newest=1))  # the stream not forged
    histories.set(order(5), recomputed(histories.get(order(5)), 1, "s=", "s=1"))  # nor here
    ran = await cli(capsys, "audit", "verify", "--store", store_url)
    assert ran.code == 1
    assert f"record {order(3)}: its history is gone" in ran.err
    assert f"record {order(4)}: the newest event the audit stream holds" in ran.err
    assert f"record {order(5)}: the newest event the audit stream holds" in ran.err
    assert f"record {order(1)}: event 1 (completed" in ran.err
    assert order(2) not in ran.err  # rewritten, and the stream made to agree: not seen
    assert "no audit key: an edit is caught, a recomputed chain or a cut is not" in ran.out


async def test_verify_says_what_it_could_not_check_and_what_is_unsealed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    keyed = f"sqlite:///{tmp_path / 'keyed.db'}"
    plain = f"sqlite:///{tmp_path / 'plain.db'}"
    await charge(plain, range(1, 3))
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    await charge(keyed, range(1, 3))
    unsealed = await cli(capsys, "audit", "verify", "--store", plain)
    assert unsealed.code == 1
    assert f"record {order(1)}: not sealed with the audit key" in unsealed.err
    assert "2 histories hold events not sealed with the audit key" in unsealed.err
    allowed = await cli(capsys, "audit", "verify", "--allow-unsealed", "--store", plain)
    assert allowed.code == 0, allowed.err
    monkeypatch.delenv(KEY_VARIABLE)
    unchecked = await cli(capsys, "audit", "verify", "--store", keyed)
    assert unchecked.code == 2
    assert f"record {order(1)}: sealed with audit key {KEY_ID}" in unchecked.err
    assert "2 histories are sealed with an audit key and were not checked" in unchecked.err
    assert (await cli(capsys, "audit", "verify", "--store", plain)).code == 0  # as before


async def test_keys_history_warns_when_its_chain_does_not_verify(
    store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    await charge(store_url, range(1, 2))
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    await charge(store_url, range(2, 3))
    histories = raw(store_url)

    async def history(record: str) -> tuple[list[object], str]:
        shown = await cli(capsys, "keys", "history", record, "--store", store_url)
        assert shown.code == 0 and shown.out.startswith("AT "), shown
        as_json = await cli(capsys, "keys", "history", record, "--store", store_url, "--json")
        assert as_json.err == shown.err
        return [event["verified"] for event in as_json.json()], shown.err

    monkeypatch.delenv(KEY_VARIABLE)
    assert await history(order(1)) == ([True] * 3, "")
    histories.set(order(1), edited(histories.get(order(1)), 1, "s=", "s=1"))
    verified, warned = await history(order(1))
    assert verified == [True, False, False]
    assert f"WARNING: record {order(1)}'s history does not verify: event 1 (completed" in warned
    verified, warned = await history(order(2))  # sealed, and no key here
    assert verified == [None] * 3 and "WARNING" not in warned
    assert f"sealed with audit key {KEY_ID}" in warned
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    assert await history(order(2)) == ([True] * 3, "")
    histories.set(order(2), cut(histories.get(order(2)), oldest=1))
    verified, warned = await history(order(2))
    assert verified == [False] * 2 and "WARNING" in warned, warned


async def test_an_audit_key_in_a_store_url_is_never_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"sqlite:///{tmp_path / 'none.db'}?audit_key={KEY}"
    ran = await cli(capsys, "keys", "list", "--store", missing)
    assert ran.code == 3 and "audit_key=***" in ran.err and KEY not in ran.err + ran.out
    short = "sqlite:///x.db?audit_key=tooshort-SECRET"
    refused = await cli(capsys, "keys", "list", "--store", short)
    assert refused.code == 2 and "shorter than 16 bytes" in refused.err
    assert "tooshort-SECRET" not in refused.err + refused.out
