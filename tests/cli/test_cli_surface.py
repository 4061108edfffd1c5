"""The command line's surface: every option says what it does, and output piped into a reader
that stops early (`mcp-once keys list --json | head`) ends quietly, with no traceback.

The pipe tests run the installed console script as a real process writing into a real pipe."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from idempotency import SQLiteKeyStore
from mcp_once._cli import EXIT_BROKEN_PIPE, build_parser

RECORDS = 600  # ~200 KB of JSON: more than a pipe holds, so the writer must meet the closed end


def options(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    """Every argument and sub-command of `parser`'s tree, with where it sits."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{path} {name}", argparse.Action([], name, help=helped.get(name))
                yield from options(sub, f"{path} {name}")
        else:
            yield f"{path} {'/'.join(action.option_strings) or action.dest}", action


def test_every_option_and_command_has_help() -> None:
    walked = list(options(build_parser(), "mcp-once"))
    assert len(walked) > 40  # the walk reaches the sub-commands' options
    assert any(where.endswith("settle --retention") for where, _ in walked)
    missing = [where for where, action in walked if not action.help]
    assert missing == []


def test_the_walk_sees_an_option_without_help() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers().add_parser("x", help="x")
    sub.add_argument("--bare")
    assert [w for w, a in options(parser, "p") if not a.help] == ["p x --bare"]


def console_script() -> str:
    script = Path(sys.executable).with_name("mcp-once")
    assert script.exists(), f"the console script is not installed next to {sys.executable}"
    return str(script)


@pytest.fixture(scope="module")
def many_records(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("pipe") / "keys.sqlite3"

    async def fill() -> None:
        store = SQLiteKeyStore(path)
        for n in range(RECORDS):
            await store.claim(f"{n:064x}", "fp", lease=3600, takeover=False)
        await store.aclose()

    anyio.run(fill)
    return f"sqlite:///{path}"


def test_json_piped_into_head_exits_quietly(many_records: str) -> None:
    argv = [console_script(), "keys", "list", "--json", "--limit", str(RECORDS)]
    full = subprocess.run(
        [*argv, "--store", many_records], capture_output=True, timeout=60, check=True
    )
    assert len(full.stdout) > 128 * 1024  # more than any pipe buffer: the write must block
    # `| head -n 2`: the reader takes two lines and exits while the command is still writing.
    writer = subprocess.Popen(
        [*argv, "--store", many_records], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert writer.stdout is not None and writer.stderr is not None
    head = subprocess.run(["head", "-n", "2"], stdin=writer.stdout, capture_output=True, timeout=60)
    writer.stdout.close()
    err = writer.stderr.read().decode()
    writer.stderr.close()
    assert writer.wait(timeout=60) == EXIT_BROKEN_PIPE
    assert head.stdout.decode().splitlines()[0] == "["
    assert err == ""  # no traceback, no "Exception ignored" at shutdown


def into_a_closed_pipe(argv: list[str], store: str) -> subprocess.CompletedProcess[bytes]:
    """`argv` run with its stdout a pipe whose read end is already closed (a reader gone)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            argv,
            stdout=write_end,
            stderr=subprocess.PIPE,
            env={**os.environ, "MCP_ONCE_STORE": store},
            timeout=60,
        )
    finally:
        os.close(write_end)


def test_a_reader_gone_before_the_first_write_is_quiet_too(many_records: str) -> None:
    """The read end closed before the command starts: even its very first (and the
    interpreter's final) flush meets a broken pipe."""
    ran = into_a_closed_pipe(
        [console_script(), "keys", "list", "--json", "--limit", "1"], many_records
    )
    assert (ran.returncode, ran.stderr.decode()) == (EXIT_BROKEN_PIPE, "")


def test_without_the_handling_the_pipe_would_show_a_traceback(many_records: str) -> None:
    """The same command through `main` without `entry`'s handling: Python's own behaviour is the
    traceback the issue reported, so the tests above see a difference."""
    code = (
        "import sys; from mcp_once._cli import main;"
        " sys.exit(main(['keys', 'list', '--json', '--limit', '1']))"
    )
    ran = into_a_closed_pipe([sys.executable, "-c", code], many_records)
    assert "BrokenPipeError" in ran.stderr.decode()


ROOT = Path(__file__).resolve().parents[2]


def test_the_default_files_and_sqlite_side_files_are_ignored_by_git() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = [
        ".mcp-once/keys.sqlite3",
        ".mcp-once/keys.sqlite3-wal",
        ".mcp-once/keys.sqlite3-shm",
        ".mcp-once/journal.db-wal",
        "elsewhere/keys.db-wal",
        "elsewhere/keys.db-shm",
    ]
    ran = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert sorted(ran.stdout.split()) == sorted(paths)


def test_the_help_names_the_default_paths() -> None:
    text = build_parser().epilog or ""
    assert "sqlite:///.mcp-once/keys.sqlite3" in text and "-wal and -shm" in text
    assert "sqlite:///.mcp-once/journal.db" in text
