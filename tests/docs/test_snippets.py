"""Every Python block in README.md and docs/**/*.md runs as shown, or is an exact excerpt.

A block is one of two kinds, told by the HTML comment on the line before its fence:

- `<!-- snippet: examples/NAME.py -->`: a fragment of that file. Its lines (indentation removed
  as a whole) must appear there as a contiguous run; the file itself runs in tests/examples.
- anything else is a complete program, run as a user would run it: `python FILE` in a fresh
  directory per page, stdin closed, in the order of the page. `<!-- file: NAME.py -->` names the
  file (later blocks of the page may start it, as a client starts its stdio server); every page's
  directory also holds the quickstart's `server.py` from the README, which the docs tell readers
  to save beside the client examples. A `<!-- output -->` comment before the next ```text block
  makes that block the program's exact stdout.

A file named `*server.py` is also driven: a client starts it over stdio and sends `charge` twice
under one key, and the second answer must be the first, replayed. So a server snippet that
registers nothing, never calls `run()`, or guards nothing fails here.

Blocks fenced as ```py or ```python3 are refused, so that no Python escapes the check.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from orchestrator import RetryingSession

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUN_TIMEOUT = 120.0

FENCE = re.compile(r"^```(\S*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"<!--\s*(snippet|file|output)(?::\s*(\S+))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    kind: str  # "snippet", "file", "output" or "" (a program with no name)
    name: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        found.append(
            Block(
                page=page,
                line=text.count("\n", 0, match.start()) + 1,
                lang=match.group(1),
                code=match.group(2),
                kind=marker.group(1) if marker else "",
                name=marker.group(2) if marker else None,
            )
        )
    return found


ALL = [block for page in PAGES for block in blocks(page)]
PYTHON = [block for block in ALL if block.lang == "python"]
SNIPPETS = [block for block in PYTHON if block.kind == "snippet"]
PROGRAM_PAGES = sorted({block.page for block in PYTHON if block.kind != "snippet"})


def quickstart_server() -> str:
    [server] = [b for b in blocks(ROOT / "README.md") if b.kind == "file" and b.name == "server.py"]
    return server.code


def test_every_python_block_is_a_program_or_an_excerpt() -> None:
    assert [b.where for b in ALL if b.lang in {"py", "python3", "pycon"}] == []
    for block in PYTHON:
        assert block.kind in {"", "file", "snippet"}, f"{block.where}: marker {block.kind!r}"
    for block in ALL:
        if block.kind == "output":
            assert block.lang == "text", f"{block.where}: an output block is ```text"
    # What the check covers, so that a parser that stopped finding blocks is noticed.
    assert len(PYTHON) >= 20, len(PYTHON)
    assert len(SNIPPETS) >= 8, len(SNIPPETS)
    assert len(PYTHON) - len(SNIPPETS) >= 10


def is_excerpt(code: str, source: str) -> bool:
    """Whether `code`'s lines, indentation removed as a whole, are a contiguous run of `source`."""
    wanted = textwrap.dedent(code).strip("\n").splitlines()
    lines = source.splitlines()
    return bool(wanted) and any(
        textwrap.dedent("\n".join(lines[start : start + len(wanted)])).splitlines() == wanted
        for start in range(len(lines) - len(wanted) + 1)
    )


@pytest.mark.parametrize("block", SNIPPETS, ids=[b.where for b in SNIPPETS])
def test_excerpt_appears_verbatim_in_its_example(block: Block) -> None:
    assert block.name is not None and block.name.startswith("examples/"), block.where
    source = (ROOT / block.name).read_text()
    assert is_excerpt(block.code, source), f"{block.where}: not a verbatim excerpt of {block.name}"


def test_the_excerpt_check_sees_a_changed_line() -> None:
    [block, *_] = SNIPPETS
    source = (ROOT / str(block.name)).read_text()
    assert is_excerpt(block.code, source)
    first, *rest = block.code.splitlines()
    assert not is_excerpt("\n".join([first + "  # changed", *rest]), source)
    assert not is_excerpt("\n".join(rest[::-1]), source) or len(rest) < 2


def run_program(path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, path.name],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


async def drive(server: Path) -> None:
    """Start the server over stdio; one `charge` sent twice under one key runs once."""
    params = StdioServerParameters(command=sys.executable, args=[server.name], cwd=server.parent)
    async with RetryingSession(connect=lambda: Client(params)) as session:
        answers = []
        for _ in range(2):
            result, report = await session.call_tool_with_report(
                "charge",
                {"order_id": "o-docs", "cents": 100},
                idempotency_key=f"docs-drive-{server.stem}",
            )
            assert not result.is_error, result
            answers.append((report.replayed, result.structured_content))
    (first_replayed, first), (second_replayed, second) = answers
    assert (first_replayed, second_replayed) == (False, True), server.name
    assert first == second


@pytest.mark.parametrize(
    "page", PROGRAM_PAGES, ids=[str(p.relative_to(ROOT)) for p in PROGRAM_PAGES]
)
def test_programs_on_the_page_run_as_shown(page: Path, tmp_path: Path) -> None:
    page_blocks = blocks(page)
    (tmp_path / "server.py").write_text(quickstart_server())
    programs: list[tuple[Block, Path]] = []
    for index, block in enumerate(page_blocks):
        if block.lang != "python" or block.kind == "snippet":
            continue
        path = tmp_path / (block.name or f"block_{index}.py")
        path.write_text(block.code)
        programs.append((block, path))
    for block, path in programs:
        done = run_program(path, tmp_path)
        assert done.returncode == 0, f"{block.where} exited {done.returncode}:\n{done.stderr}"
        shown = next(
            (
                later
                for later in page_blocks[page_blocks.index(block) + 1 :]
                if later.kind == "output" or later.lang == "python"
            ),
            None,
        )
        if shown is not None and shown.kind == "output":
            assert done.stdout == shown.code, f"{block.where}: the page shows other output"
        if path.name.endswith("server.py"):
            anyio.run(drive, path)


def test_driving_a_server_that_never_serves_fails(tmp_path: Path) -> None:
    """The drive can fail: the quickstart server without its `server.run()` line."""
    silent = tmp_path / "silent_server.py"
    silent.write_text(quickstart_server().replace("server.run()", "pass"))
    assert "server.run()" in quickstart_server()
    assert run_program(silent, tmp_path).returncode == 0  # exits 0 silently, as the issue saw
    with pytest.raises(BaseException):  # noqa: B017 - whatever the failed connection raises
        anyio.run(drive, silent)
