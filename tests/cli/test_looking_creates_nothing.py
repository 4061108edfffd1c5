"""Looking creates nothing (issue 38): a command that only reads refuses a store or journal
that does not exist (exit 3, naming what it looked for) and a string that is no store URL nor
an SQLite file's path (exit 2), and leaves no file behind; `runs` reads `$MCP_ONCE_JOURNAL`;
`keys show` names the store it searched; `settle --result-json` names the problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import cli, sync_cli

from idempotency import SQLiteKeyStore

KEY = "0" * 64
READERS = (["keys", "list"], ["keys", "show", KEY], ["keys", "settle", KEY, "--failed"])


@pytest.fixture(autouse=True)
def _here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MCP_ONCE_STORE", raising=False)
    monkeypatch.delenv("MCP_ONCE_JOURNAL", raising=False)


def left(tmp_path: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("argv", [*READERS, ["keys", "purge"]])
def test_a_missing_sqlite_store_is_refused_and_not_created(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = sync_cli(capsys, *argv, "--store", "keys.sqlite3")
    assert ran.code == 3 and ran.out == ""
    assert "no key store file at keys.sqlite3" in ran.err and "looking creates nothing" in ran.err
    assert left(tmp_path) == []


def test_the_default_store_in_a_folder_with_mcp_once_is_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / ".mcp-once").mkdir()
    ran = sync_cli(capsys, "keys", "list")
    assert ran.code == 3 and "no key store file at .mcp-once/keys.sqlite3" in ran.err
    assert left(tmp_path) == [".mcp-once"]


@pytest.mark.parametrize("url", ["127.0.0.1:56669", "localhost:6379/0", "keys"])
def test_a_string_that_is_no_store_url_is_refused(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (*READERS, ["serve-example", "--port", "0"]):
        ran = sync_cli(capsys, *argv, "--store", url)
        assert ran.code == 2 and ran.out == ""
        assert f"{url!r} is neither a URL" in ran.err
    assert left(tmp_path) == []


def test_runs_reads_the_journal_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MCP_ONCE_JOURNAL", "sqlite:///elsewhere/journal.db")
    ran = sync_cli(capsys, "runs", "list")
    assert ran.code == 3 and "no journal file at elsewhere/journal.db" in ran.err
    assert left(tmp_path) == []


@pytest.mark.anyio
async def test_show_names_the_store_it_searched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SQLiteKeyStore(tmp_path / "keys.db")
    await store.claim("a" * 64, "fp", lease=60, takeover=False)  # the file exists, with a record
    await store.aclose()
    ran = await cli(capsys, "keys", "show", KEY, "--store", "keys.db")
    assert ran.code == 1
    said = f"mcp-once: no live record for key {KEY} in the key store at 'keys.db'"
    assert ran.err.strip() == said


def test_settle_result_json_names_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "result.json"
    bad.write_text(json.dumps({"content": [{"type": "txt", "text": "ok"}]}))
    ran = sync_cli(capsys, "keys", "settle", KEY, "--result-json", str(bad), "--store", "k.db")
    assert ran.code == 2
    assert "is not a CallToolResult: content.0" in ran.err and "problems)" not in ran.err
