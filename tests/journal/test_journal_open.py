"""`open_journal(url)`: each URL form to its journal, the default file under `.mcp-once/`, and a
clear `ValueError` for anything else."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator._journal import MemoryJournal, SQLiteJournal, open_journal

pytestmark = pytest.mark.anyio


async def test_memory() -> None:
    assert isinstance(open_journal("memory://"), MemoryJournal)


async def test_sqlite_relative_and_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    relative = open_journal("sqlite:///runs/j.db")
    absolute = open_journal(f"sqlite:///{tmp_path}/abs.db")
    assert isinstance(relative, SQLiteJournal) and relative.path == Path("runs/j.db")
    assert isinstance(absolute, SQLiteJournal) and absolute.path == tmp_path / "abs.db"
    try:
        await relative.acquire("r", "a", 1.0)  # the directory is made on first use
        assert (tmp_path / "runs" / "j.db").is_file()
    finally:
        await relative.aclose()
        await absolute.aclose()


async def test_the_default_is_a_sqlite_file_under_dot_mcp_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    journal = open_journal()
    assert isinstance(journal, SQLiteJournal)
    assert journal.path == tmp_path / ".mcp-once" / "journal.db"
    try:
        assert await journal.acquire("r", "a", 1.0) == 1
        assert journal.path.is_file()
    finally:
        await journal.aclose()


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "rediss://127.0.0.1:6379/0",
        "unix:///tmp/redis.sock",
        "redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
        "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/2",
    ],
)
async def test_redis_forms(url: str) -> None:
    from orchestrator._journal.redis import RedisJournal

    journal = open_journal(url)
    assert isinstance(journal, RedisJournal)
    await journal.aclose()  # nothing was connected


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("", "non-empty"),
        ("   ", "non-empty"),
        ("memory://somewhere", "no location"),
        ("sqlite://relative.db", "expected sqlite:///"),
        ("sqlite:///", "names no file"),
        ("sqlite:///j.db?mode=ro", "query or fragment"),
        ("postgres://db/runs", "unknown journal URL scheme 'postgres'"),
        ("just-a-word", "unknown journal URL scheme"),
        ("redis+cluster://host-without-port", "not host:port"),
        ("redis+sentinel://127.0.0.1:26379", "service_name"),
    ],
)
async def test_a_bad_url_is_a_clear_value_error(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        open_journal(url)


async def test_a_non_string_is_refused() -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        open_journal(42)  # type: ignore[arg-type]
