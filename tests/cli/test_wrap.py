"""`mcp-once wrap CONFIG` on each client's config shape, byte for byte (`--no-tools`: no server is
started here; `tests/proxy/test_proxy_wrap.py` starts every wrapped entry as its client would).

For Claude Desktop, Claude Code (`.mcp.json`, `~/.claude.json` per project), Cursor, Windsurf
(tabs, CRLF) and VS Code (JSONC: comments, trailing commas; `mcp.json`'s `servers` and its
settings' `mcp.servers`): the wrapped file is exactly the text
written below (only the entries' command lines differ), the backup is the original, `--dry-run`
prints the unified diff and writes nothing, wrapping again changes nothing ("already wrapped"),
and `--undo` gives the original back byte for byte, also after other edits of the file, after
two runs that wrapped one entry each, and without the backup where the entry had `args`.
Refused in one line, exit 2, the file untouched: not JSON, comments where the client allows none,
no servers, an unknown `--server`, a read-only file or folder; a crash mid-write leaves the
original whole.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_run import Ran, sync_cli

from mcp_once._cli import _wrap
from mcp_once._cli._jsonc import JsoncError, parse
from mcp_once._cli._launcher import Launcher, find_launcher

#: What `wrap` writes as the command in this test process: the console script beside the Python.
MCP_ONCE = find_launcher().words[0]


@dataclass(frozen=True)
class Shape:
    """A client's config file: its name, its text, and the text `wrap` must make of it."""

    client: str
    file: str
    before: str
    wrapped: str

    def __str__(self) -> str:
        return self.client


CLAUDE_DESKTOP = Shape(
    "claude-desktop",
    "claude_desktop_config.json",
    """{
  "globalShortcut": "Alt+Space",
  "mcpServers": {
    "memory": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-memory"],
      "env": {
        "MEMORY_FILE_PATH": "/Users/me/memory.jsonl"
      }
    },
    "git": {
      "command": "uvx",
      "args": [
        "mcp-server-git",
        "--repository",
        "/Users/me/src/app"
      ]
    }
  }
}
""",
    """{
  "globalShortcut": "Alt+Space",
  "mcpServers": {
    "memory": {
      "command": "@M@",
      "args": ["proxy", "--name", "memory", "--", "npx", "-y", "@modelcontextprotocol/server-memory"],
      "env": {
        "MEMORY_FILE_PATH": "/Users/me/memory.jsonl"
      }
    },
    "git": {
      "command": "@M@",
      "args": [
        "proxy",
        "--name",
        "git",
        "--",
        "uvx",
        "mcp-server-git",
        "--repository",
        "/Users/me/src/app"
      ]
    }
  }
}
""",  # noqa: E501
)

CLAUDE_CODE_PROJECT = Shape(
    "claude-code-mcp-json",
    ".mcp.json",
    """{
  "mcpServers": {
    "ledger": {
      "type": "stdio",
      "command": "node",
      "args": ["dist/index.js"],
      "env": {"LEDGER_DIR": "${HOME}/ledger"}
    },
    "docs": {
      "type": "http",
      "url": "https://mcp.example.com/mcp"
    }
  }
}
""",
    """{
  "mcpServers": {
    "ledger": {
      "type": "stdio",
      "command": "@M@",
      "args": ["proxy", "--name", "ledger", "--", "node", "dist/index.js"],
      "env": {"LEDGER_DIR": "${HOME}/ledger"}
    },
    "docs": {
      "type": "stdio",
      "command": "@M@",
      "args": ["proxy", "--name", "docs", "--upstream", "https://mcp.example.com/mcp"]
    }
  }
}
""",
)

CLAUDE_CODE_USER = Shape(
    "claude-code-claude-json",
    ".claude.json",
    """{
  "numStartups": 12,
  "projects": {
    "/home/me/app": {
      "allowedTools": [],
      "mcpServers": {
        "memory": {
          "type": "stdio",
          "command": "npx",
          "args": [
            "-y",
            "@modelcontextprotocol/server-memory"
          ],
          "env": {}
        }
      },
      "hasTrustDialogAccepted": true
    },
    "/home/me/other": {
      "mcpServers": {}
    }
  },
  "mcpServers": {
    "time": {
      "type": "stdio",
      "command": "uvx",
      "args": [],
      "env": {}
    }
  }
}
""",
    """{
  "numStartups": 12,
  "projects": {
    "/home/me/app": {
      "allowedTools": [],
      "mcpServers": {
        "memory": {
          "type": "stdio",
          "command": "@M@",
          "args": [
            "proxy",
            "--name",
            "memory",
            "--",
            "npx",
            "-y",
            "@modelcontextprotocol/server-memory"
          ],
          "env": {}
        }
      },
      "hasTrustDialogAccepted": true
    },
    "/home/me/other": {
      "mcpServers": {}
    }
  },
  "mcpServers": {
    "time": {
      "type": "stdio",
      "command": "@M@",
      "args": ["proxy", "--name", "time", "--", "uvx"],
      "env": {}
    }
  }
}
""",
)

CURSOR = Shape(
    "cursor",
    "mcp.json",
    """{
  "mcpServers": {
    "local": {
      "command": "/opt/tools/server"
    },
    "remote": {
      "url": "https://mcp.example.com/mcp"
    }
  }
}
""",
    """{
  "mcpServers": {
    "local": {
      "command": "@M@",
      "args": ["proxy", "--name", "local", "--", "/opt/tools/server"]
    },
    "remote": {
      "command": "@M@",
      "args": ["proxy", "--name", "remote", "--upstream", "https://mcp.example.com/mcp"]
    }
  }
}
""",
)

#: Windsurf's file, indented with tabs and with Windows line endings.
WINDSURF = Shape(
    "windsurf-tabs-crlf",
    "mcp_config.json",
    """{
\t"mcpServers": {
\t\t"memory": {
\t\t\t"command": "npx",
\t\t\t"args": ["-y", "@modelcontextprotocol/server-memory"],
\t\t\t"disabled": false
\t\t},
\t\t"remote": {
\t\t\t"serverUrl": "https://mcp.example.com/mcp"
\t\t}
\t}
}
""".replace("\n", "\r\n"),
    """{
\t"mcpServers": {
\t\t"memory": {
\t\t\t"command": "@M@",
\t\t\t"args": ["proxy", "--name", "memory", "--", "npx", "-y", "@modelcontextprotocol/server-memory"],
\t\t\t"disabled": false
\t\t},
\t\t"remote": {
\t\t\t"command": "@M@",
\t\t\t"args": ["proxy", "--name", "remote", "--upstream", "https://mcp.example.com/mcp"]
\t\t}
\t}
}
""".replace("\n", "\r\n"),  # noqa: E501
)

#: VS Code's `.vscode/mcp.json`: JSONC, with comments and trailing commas.
VSCODE = Shape(
    "vscode-jsonc",
    "mcp.json",
    """{
  // Servers of this workspace
  "inputs": [
    {"type": "promptString", "id": "api-key", "description": "API key", "password": true},
  ],
  "servers": {
    "memory": {
      "type": "stdio",
      "command": "npx",
      "args": [
        "-y", // the package, not a prompt
        "@modelcontextprotocol/server-memory",
      ],
      "env": {"MEMORY_FILE_PATH": "${workspaceFolder}/memory.jsonl"},
    },
    /* the team's server */
    "remote": {
      "type": "http",
      "url": "https://mcp.example.com/mcp",
    },
  },
}
""",
    """{
  // Servers of this workspace
  "inputs": [
    {"type": "promptString", "id": "api-key", "description": "API key", "password": true},
  ],
  "servers": {
    "memory": {
      "type": "stdio",
      "command": "@M@",
      "args": [
        "proxy",
        "--name",
        "memory",
        "--",
        "npx",
        "-y", // the package, not a prompt
        "@modelcontextprotocol/server-memory",
      ],
      "env": {"MEMORY_FILE_PATH": "${workspaceFolder}/memory.jsonl"},
    },
    /* the team's server */
    "remote": {
      "type": "stdio",
      "command": "@M@",
      "args": ["proxy", "--name", "remote", "--upstream", "https://mcp.example.com/mcp"],
    },
  },
}
""",
)

#: VS Code's user settings, whose servers are under `mcp.servers`.
VSCODE_SETTINGS = Shape(
    "vscode-settings",
    "settings.json",
    """{
    "editor.fontSize": 13, // mine
    "mcp": {
        "servers": {
            "git": {"type": "stdio", "command": "uvx", "args": ["mcp-server-git"]}
        }
    }
}
""",
    """{
    "editor.fontSize": 13, // mine
    "mcp": {
        "servers": {
            "git": {"type": "stdio", "command": "@M@", "args": ["proxy", "--name", "git", "--", "uvx", "mcp-server-git"]}
        }
    }
}
""",  # noqa: E501
)

SHAPES = [
    CLAUDE_DESKTOP,
    CLAUDE_CODE_PROJECT,
    CLAUDE_CODE_USER,
    CURSOR,
    WINDSURF,
    VSCODE,
    VSCODE_SETTINGS,
]


def wrapped_text(shape: Shape) -> str:
    return shape.wrapped.replace("@M@", MCP_ONCE)


def config(tmp_path: Path, shape: Shape) -> Path:
    path = tmp_path / shape.client / shape.file
    path.parent.mkdir(parents=True)
    path.write_bytes(shape.before.encode())
    return path


def wrap(capsys: pytest.CaptureFixture[str], path: Path, *options: str) -> Ran:
    return sync_cli(capsys, "wrap", str(path), "--no-tools", *options)


def backup(path: Path) -> Path:
    return path.with_name(path.name + ".mcp-once.bak")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_wrap_rewrites_only_the_command_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shape: Shape
) -> None:
    path = config(tmp_path, shape)
    ran = wrap(capsys, path)
    assert ran.code == 0, ran.err
    assert path.read_bytes() == wrapped_text(shape).encode()
    assert backup(path).read_bytes() == shape.before.encode()
    assert f"wrapped {path}" in ran.out and MCP_ONCE in ran.out
    names = [e["name"] for e in table(ran.out)]
    assert all(row["CHANGE"] == "wrapped" for row in table(ran.out)), ran.out
    assert len(names) == shape.before.count('"command"') + shape.before.count('rl": ')


def table(out: str) -> list[dict[str, str]]:
    """The rows of the report's table (SERVER IN CHANGE ...), the change read as one cell."""
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("SERVER "))
    starts = [lines[head].index(c) for c in ("SERVER", "IN", "CHANGE", "UPSTREAM", "TOOLS")]
    rows = []
    for line in lines[head + 1 :]:
        if not line or line.startswith((" ", "mcp-once:")):
            break
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows.append({"name": cells[0], "IN": cells[1], "CHANGE": cells[2]})
    return rows


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dry_run_shows_the_diff_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shape: Shape
) -> None:
    path = config(tmp_path, shape)
    ran = wrap(capsys, path, "--dry-run")
    assert ran.code == 0, ran.err
    assert path.read_bytes() == shape.before.encode()
    assert not backup(path).exists()
    assert sorted(p.name for p in path.parent.iterdir()) == [shape.file]
    diff = ran.out[: ran.out.index("SERVER ")]
    expected = difflib.unified_diff(
        shape.before.splitlines(keepends=True),
        wrapped_text(shape).splitlines(keepends=True),
        fromfile=str(path),
        tofile=f"{path} (wrapped)",
    )
    assert diff == "".join(expected)
    assert diff.count("\n+      ") + diff.count("\n+\t") > 0  # lines of the entries, added
    assert "dry run: nothing written" in ran.out


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_wrapping_twice_changes_nothing_and_undo_restores_every_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shape: Shape
) -> None:
    path = config(tmp_path, shape)
    assert wrap(capsys, path).code == 0
    again = wrap(capsys, path)
    assert again.code == 0, again.err
    assert path.read_bytes() == wrapped_text(shape).encode()
    assert {row["CHANGE"] for row in table(again.out)} == {"already wrapped"}
    assert "nothing to change" in again.out
    assert backup(path).read_bytes() == shape.before.encode()  # not the wrapped file
    shown = wrap(capsys, path, "--undo", "--dry-run")
    assert shown.code == 0 and f"+++ {path} (restored)" in shown.out
    assert path.read_bytes() == wrapped_text(shape).encode()
    undone = wrap(capsys, path, "--undo")
    assert undone.code == 0, undone.err
    assert {row["CHANGE"] for row in table(undone.out)} == {"restored"}
    assert path.read_bytes() == shape.before.encode()
    assert wrap(capsys, path, "--undo").out.count("not wrapped") == len(table(undone.out))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_undo_keeps_other_edits_of_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shape: Shape
) -> None:
    """After wrapping, the user (or the client) changes other settings: undo restores the
    entries and keeps those changes."""
    path = config(tmp_path, shape)
    assert wrap(capsys, path).code == 0
    first_line = shape.before.split("\n", 1)[0]
    edited = wrapped_text(shape).replace(first_line, first_line + ' "theme": "dark",', 1)
    path.write_bytes(edited.encode())
    assert wrap(capsys, path, "--undo").code == 0
    assert (
        path.read_bytes()
        == shape.before.replace(first_line, first_line + ' "theme": "dark",', 1).encode()
    )


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_wrapping_entry_by_entry_then_undo_restores_every_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shape: Shape
) -> None:
    """One run per entry (`--server`): the backup stays the file with nothing wrapped, so undo
    is exact for the entries of the first run too."""
    path = config(tmp_path, shape)
    names = [row["name"] for row in table(wrap(capsys, path, "--dry-run").out)]
    for name in names:
        ran = wrap(capsys, path, "--server", name)
        assert ran.code == 0, ran.err
        assert [r["CHANGE"] for r in table(ran.out)] == ["wrapped"] * names.count(name)
    assert path.read_bytes() == wrapped_text(shape).encode()
    assert backup(path).read_bytes() == shape.before.encode()
    assert wrap(capsys, path, "--undo", "--server", names[0]).code == 0
    assert wrap(capsys, path, "--undo").code == 0
    assert path.read_bytes() == shape.before.encode()


@pytest.mark.parametrize("shape", [CLAUDE_DESKTOP, CLAUDE_CODE_USER, VSCODE], ids=str)
def test_undo_without_the_backup_restores_entries_with_args_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shape: Shape
) -> None:
    """The original command and arguments are in the wrapped entry itself: with the backup gone,
    an entry that had `args` comes back byte for byte."""
    path = config(tmp_path, shape)
    assert wrap(capsys, path, "--server", "memory").code == 0
    backup(path).unlink()
    undone = wrap(capsys, path, "--undo")
    assert undone.code == 0, undone.err
    assert "from its command line" in undone.out
    assert path.read_bytes() == shape.before.encode()


def test_undo_without_the_backup_restores_the_value_of_other_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An entry without `args` and a URL entry: the same value (an empty `args`, the client's
    URL key), where the backup held the exact text."""
    for shape in (CURSOR, WINDSURF, CLAUDE_CODE_PROJECT):
        path = config(tmp_path, shape)
        assert wrap(capsys, path).code == 0
        backup(path).unlink()
        assert wrap(capsys, path, "--undo").code == 0
        after = parse(path.read_text()).root.value()
        servers = after["mcpServers"]
        for name, value in parse(shape.before).root.value()["mcpServers"].items():
            restored = {"args": [], **value} if "command" in value else value
            assert servers[name] == restored, (shape, name)


def test_undo_of_an_entry_edited_since_keeps_the_edit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key rotated in a wrapped entry's `env`: undo restores its command line and keeps the
    new `env` (never the backup's older one)."""
    path = config(tmp_path, CLAUDE_DESKTOP)
    assert wrap(capsys, path).code == 0
    rotated = path.read_text().replace("/Users/me/memory.jsonl", "/Users/me/new.jsonl")
    path.write_text(rotated)
    undone = wrap(capsys, path, "--undo")
    assert undone.code == 0, undone.err
    assert path.read_text() == CLAUDE_DESKTOP.before.replace("memory.jsonl", "new.jsonl")


def test_undo_leaves_an_entry_wrapped_by_hand_with_other_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = json.dumps(
        {
            "mcpServers": {
                "pay": {
                    "command": "mcp-once",
                    "args": ["proxy", "--policy", "/etc/p.toml", "--", "node", "pay.js"],
                }
            }
        }
    )
    path = tmp_path / "config.json"
    path.write_text(text)
    ran = wrap(capsys, path, "--undo")
    assert ran.code == 1
    assert "wrapped with --policy, which wrap does not write: restore it by hand" in ran.out
    assert path.read_text() == text
    wrapped = wrap(capsys, path)
    assert wrapped.code == 0 and table(wrapped.out)[0]["CHANGE"] == "already wrapped"
    assert path.read_text() == text


def test_url_entries_that_cannot_be_fronted_are_refused_and_the_rest_wrapped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Headers (the proxy takes none on its command line: a secret there is readable by every
    process), a URL with credentials or a query, SSE: each refused with its reason, exit 1;
    the other entries are wrapped."""
    servers = {
        "headers": {"url": "https://a.example/mcp", "headers": {"Authorization": "Bearer s3cret"}},
        "query": {"url": "https://a.example/mcp?key=s3cret"},
        "sse": {"type": "sse", "url": "https://a.example/sse"},
        "plain": {"command": "server"},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"mcpServers": servers}, indent=2))
    ran = wrap(capsys, path)
    assert ran.code == 1
    changes = {row["name"]: row["CHANGE"] for row in table(ran.out)}
    assert changes == {
        "headers": "refused",
        "query": "refused",
        "sse": "refused",
        "plain": "wrapped",
    }
    assert "it has headers, which mcp-once proxy takes only from a config file" in ran.out
    assert "its URL holds credentials or a query" in ran.out
    assert "an SSE server" in ran.out
    assert "s3cret" not in ran.out + ran.err
    after = json.loads(path.read_text())["mcpServers"]
    assert {k: v for k, v in after.items() if k != "plain"} == {
        k: v for k, v in servers.items() if k != "plain"
    }


def test_a_symlinked_config_is_replaced_at_its_target_with_its_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Dotfiles kept in a repository and linked: the link stays a link; the file and its backup
    keep the file's mode (a config holds secrets in `env`)."""
    target = config(tmp_path, CLAUDE_DESKTOP)
    target.chmod(0o600)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert wrap(capsys, link).code == 0
    assert link.is_symlink() and link.read_bytes() == wrapped_text(CLAUDE_DESKTOP).encode()
    for path in (target, backup(target)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert not backup(link).exists()


REFUSED = [
    ("not-json", "{'mcpServers': {}}", "is not JSON: line 1 column 2: a member's name"),
    ("truncated", '{"mcpServers": {"a": {"command": "x"}', "is not JSON: line 1 column 38"),
    ("not-utf8", b'{"mcpServers": {"\xff": {}}}', "is not JSON: it is not UTF-8 text"),
    (
        "comments-in-claude-desktop",
        '{\n  // mine\n  "mcpServers": {"a": {"command": "x"}}\n}\n',
        "is not JSON: a comment or a trailing comma at line 2 column 3 (only VS Code's mcp.json",
    ),
    (
        "trailing-comma-in-cursor",
        '{"mcpServers": {"a": {"command": "x"},}}',
        "a comment or a trailing comma at line 1 column 38",
    ),
    ("no-servers-key", '{"globalShortcut": "x"}', "has no MCP servers"),
    ("empty-servers", '{"mcpServers": {}}', "has no MCP servers"),
    ("an-array", "[]", "has no MCP servers"),
]


@pytest.mark.parametrize(("case", "content", "said"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_file_that_is_not_a_client_config_is_refused_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, content: str | bytes, said: str
) -> None:
    path = tmp_path / "config.json"
    data = content if isinstance(content, bytes) else content.encode()
    path.write_bytes(data)
    for options in ((), ("--undo",), ("--dry-run",)):
        ran = wrap(capsys, path, *options)
        assert ran.code == 2, (options, ran)
        assert ran.out == "" and ran.err.count("\n") == 1, ran.err
        assert said in ran.err, ran.err
    assert path.read_bytes() == data
    assert sorted(tmp_path.iterdir()) == [path]


def test_an_unknown_server_is_refused_naming_the_servers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path, CLAUDE_DESKTOP)
    ran = wrap(capsys, path, "--server", "memry")
    assert ran.code == 2 and ran.err.count("\n") == 1
    assert "has no server 'memry' (its servers: git, memory)" in ran.err
    assert path.read_bytes() == CLAUDE_DESKTOP.before.encode()


def test_a_missing_file_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = wrap(capsys, tmp_path / "nope.json")
    assert ran.code == 2 and ran.err.count("\n") == 1
    assert "cannot read" in ran.err and "No such file or directory" in ran.err


@contextmanager
def unwritable(path: Path) -> Iterator[None]:
    """`path` made unwritable for this process: immutable (`chattr +i`) where the tests run as
    root, whom no mode stops; its write bits taken away otherwise."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        return
    mode = stat.S_IMODE(path.stat().st_mode)
    path.chmod(mode & ~0o222)
    try:
        yield
    finally:
        path.chmod(mode)


def unchanged(path: Path, shape: Shape) -> None:
    assert path.read_bytes() == shape.before.encode()
    assert sorted(p.name for p in path.parent.iterdir()) == [shape.file]


@pytest.mark.parametrize("what", ["read-only-file", "immutable-file", "folder"])
def test_a_file_that_cannot_be_written_is_refused_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    path = config(tmp_path, CLAUDE_DESKTOP)
    if what == "read-only-file":
        path.chmod(0o444)
        guard: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    else:
        guard = unwritable(path if what == "immutable-file" else path.parent)
    with guard:
        ran = wrap(capsys, path)
        assert ran.code == 2, ran
        assert ran.out == "" and ran.err.count("\n") == 1, ran.err
        assert f"cannot write {path}" in ran.err and "nothing changed" in ran.err
        unchanged(path, CLAUDE_DESKTOP)
        assert wrap(capsys, path, "--dry-run").code == 0  # looking needs no write


@pytest.mark.parametrize("crash", ["fsync", "replace"])
def test_a_crash_while_writing_leaves_the_original_whole(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    crash: str,
) -> None:
    """The new text goes to a file beside the config, which is renamed over it only once it is
    on disk: a failure before the rename (the disk full at the flush, the rename refused)
    leaves the original as it was and no partial file behind."""
    path = config(tmp_path, CLAUDE_DESKTOP)
    real_replace = os.replace

    real_fsync = os.fsync

    def failing_fsync(descriptor: int) -> None:
        """The disk full when the config's new text is flushed (the backup's went through)."""
        name = Path(os.readlink(f"/proc/self/fd/{descriptor}")).name
        if name.lstrip(".").startswith(path.name) and ".mcp-once.bak" not in name:
            raise OSError(28, "No space left on device")
        real_fsync(descriptor)

    def failing_replace(source: str | Path, target: str | Path) -> None:
        if Path(target) == path:
            raise OSError(5, "Input/output error")
        real_replace(source, target)

    if crash == "fsync":
        monkeypatch.setattr(_wrap.os, "fsync", failing_fsync)
    else:
        monkeypatch.setattr(_wrap.os, "replace", failing_replace)
    ran = wrap(capsys, path)
    assert ran.code == 2 and ran.err.count("\n") == 1, ran.err
    assert "the file is as it was" in ran.err
    assert path.read_bytes() == CLAUDE_DESKTOP.before.encode()
    leftovers = {p.name for p in path.parent.iterdir()} - {path.name, backup(path).name}
    assert leftovers == set()


def test_an_interrupt_while_writing_leaves_the_original_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C in the middle of writing the new text: half of it is in the file beside the
    config, which is removed; the config is whole."""
    path = config(tmp_path, CLAUDE_DESKTOP)
    text = wrapped_text(CLAUDE_DESKTOP)

    class Interrupted(KeyboardInterrupt):
        pass

    def half_then_interrupt(descriptor: int) -> None:
        partial = [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
        assert len(partial) == 1 and partial[0].stat().st_size > 0
        raise Interrupted

    monkeypatch.setattr(_wrap.os, "fsync", half_then_interrupt)
    with pytest.raises(Interrupted):
        _wrap.replace_atomically(path, text, 0o644)
    unchanged(path, CLAUDE_DESKTOP)


# -- the launcher written into the entries ------------------------------------------------------


def test_the_launcher_is_the_running_installation_by_absolute_path(tmp_path: Path) -> None:
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    python = str(venv / "python")
    script = venv / "mcp-once"
    assert find_launcher(str(script), python, str(venv.parent), {}).words == (str(script),)
    os.chdir(venv)  # a console script started by a relative path
    assert find_launcher("./mcp-once", python, str(venv.parent), {}).words == (str(script),)
    main = "/site-packages/mcp_once/__main__.py"  # python -m mcp_once
    assert find_launcher(main, python, str(venv.parent), {}).words == (python, "-m", "mcp_once")
    script.write_text("#!/bin/sh\n")
    assert find_launcher(main, python, str(venv.parent), {}).words == (str(script),)


def test_under_uvx_the_launcher_is_uvx_pinned_to_this_installation(tmp_path: Path) -> None:
    """`uvx` runs a tool in an environment in uv's cache, which `uv cache clean` removes: the
    entry gets `uvx --from <this mcp-once> mcp-once`, by absolute path."""
    cache = tmp_path / ".cache" / "uv" / "archive-v0" / "abc123"
    python = str(cache / "bin" / "python")
    argv0 = str(cache / "bin" / "mcp-once")
    uv = tmp_path / "bin" / "uv"
    uv.parent.mkdir()
    without_uvx = find_launcher(argv0, python, str(cache), {"UV": str(uv)}).words
    assert without_uvx[:3] == (str(uv), "tool", "run")
    (uv.parent / "uvx").write_text("")
    words = find_launcher(argv0, python, str(cache), {"UV": str(uv)}).words
    assert words[0] == str(uv.parent / "uvx") and words[1] == "--from" and words[3] == "mcp-once"
    assert words[2].startswith("mcp-once[fastmcp]")  # `==VERSION`, or `@ URL` it came from
    # Without $UV: `uvx` on PATH, else (none there, or not executable) the script in uv's cache,
    # as a last resort.
    on_path = {"PATH": str(uv.parent)}
    assert find_launcher(argv0, python, str(cache), on_path).words == (argv0,)
    (uv.parent / "uvx").chmod(0o755)
    assert find_launcher(argv0, python, str(cache), on_path).words == words


# -- the JSON(C) reader the edits stand on ------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_reader_reads_what_json_reads_and_notes_jsonc(shape: Shape) -> None:
    document = parse(shape.before)
    if shape is VSCODE:
        assert document.jsonc == (2, 3)
    elif shape is VSCODE_SETTINGS:
        assert document.jsonc == (2, 28)
    else:
        assert document.jsonc is None
        assert document.root.value() == json.loads(shape.before)
    values = ['{"a": [1, -2.5e3, true, false, null, "\\u00e9\\n"], "a": {}}', '"x"', " 0 "]
    for text in values:
        assert parse(text).root.value() == json.loads(text)
    assert parse("\ufeff{}").root.value() == {}


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"a": 1 "b": 2}', "line 1 column 9: ',' or '}' was expected"),
        ('{"a": tru}', "line 1 column 7: a value was expected"),
        ('{"a": "x\ty"}', "line 1 column 7: a string is not closed"),
        ("{\n  /* open", "line 2 column 3: a /* comment is never closed"),
        ("{} {}", "line 1 column 4: the text goes on"),
        ("", "line 1 column 1: a value was expected, the text ended"),
    ],
)
def test_the_reader_says_where_the_text_is_not_json(text: str, where: str) -> None:
    with pytest.raises(JsoncError, match=re.escape(where)):
        parse(text)


def test_the_docs_before_and_after_are_what_wrap_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/proxy.md's example, run: its "before" wrapped is its "after", to the byte."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "proxy.md").read_text()
    before, after = (
        re.search(rf"<!-- wrap-{which} -->\n```json\n(.*?\n)```", page, re.DOTALL).group(1)  # type: ignore[union-attr]
        for which in ("before", "after")
    )
    installed = Launcher(("/home/me/.local/bin/mcp-once",), "the docs' console script")
    monkeypatch.setattr(_wrap, "find_launcher", lambda: installed)
    path = tmp_path / "mcp.json"
    path.write_text(before)
    assert wrap(capsys, path).code == 0
    assert path.read_text() == after
