"""`mcp-once keys list|show` name the authenticated principal that claimed each record, by the
digest its history's claimed event keeps (never the principal, never a token), on SQLite and
Redis; a record claimed without authentication shows none. (Through the real proxy, with real
principals: `tests/proxy/test_proxy_auth.py`.)"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cli_run import cli
from fastmcp.server.auth import AccessToken

from idempotency import KeyStore, SQLiteKeyStore, history_saying, open_store, principal_digest

pytestmark = pytest.mark.anyio

ALICE = AccessToken(token="secret-token", client_id="alice", scopes=[], subject="alice")


@pytest.fixture(params=["sqlite", "redis"])
async def store_and_url(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[KeyStore, str]]:
    if request.param == "sqlite":
        path = tmp_path / "keys.sqlite3"
        store: KeyStore = SQLiteKeyStore(path)
        url = f"sqlite:///{path}"
    else:
        redis_url: str = request.getfixturevalue("redis_url")
        separator = "&" if "?" in redis_url else "?"
        url = f"{redis_url}{separator}prefix=principal-{uuid.uuid4().hex[:8]}:"
        store = open_store(url)
    try:
        yield store, url
    finally:
        await store.aclose()


async def claim(store: KeyStore, key: str, principal: str | None) -> None:
    with history_saying(scope="0" * 16, principal=principal):
        outcome = await store.claim(key, "f" * 64, lease=30.0, takeover=False, tool="charge")
    assert outcome.status.value == "claimed"


async def test_keys_name_the_principal_by_digest(
    store_and_url: tuple[KeyStore, str], capsys: pytest.CaptureFixture[str]
) -> None:
    store, url = store_and_url
    digest = principal_digest(ALICE)
    assert len(digest) == 16 and "alice" not in digest
    await claim(store, "a" * 64, digest)
    await claim(store, "b" * 64, None)
    listed = (await cli(capsys, "keys", "list", "--json", "--store", url)).json()
    assert {row["key"][0]: row["principal"] for row in listed} == {"a": digest, "b": None}
    table = (await cli(capsys, "keys", "list", "--store", url)).out.splitlines()
    assert table[0].split()[-1] == "principal"
    assert sorted(row.split()[-1] for row in table[1:-1]) == sorted([digest, "-"])
    shown = await cli(capsys, "keys", "show", "a" * 64, "--store", url)
    assert f"principal: {digest}" in shown.out.splitlines()
    history = await cli(capsys, "keys", "history", "a" * 64, "--store", url)
    assert f"principal={digest}" in history.out
    assert "secret-token" not in history.out + shown.out
