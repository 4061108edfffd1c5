"""What a stdio proxy's first answers depend on besides its caller and its upstream child: the
`static` part of a replay's inputs (`replay.py`), and where a replay may serve at all.

Why a module of its own: this is the list a reviewer checks against "what can change FastMCP's
answers", kept apart from the mechanics of answering. Hashed, each cheaply (~2.5 ms of CPU in
all, nothing heavy imported): the Python build and `sys.path`; the distributions installed there
(their `.dist-info` directory names: versions, without `importlib.metadata`'s ~40 ms); the stat of
every source file of mcp-once's own packages (an editable checkout changes without a version);
the proxy's whole command line and working directory; the contents of the files its options name
(policy, config, token files) and of FastMCP's dotenv file (`FASTMCP_ENV_FILE`, else `.env`,
which its settings read); and the `FASTMCP_*` / `MCP_ONCE_*` environment (values only hashed,
never stored).

When: the cheap inputs at the start (`Static`); the distributions and the sources (most of the
~2.5 ms) only when the digest is asked for: at once when a replay file is there to be checked,
else once the first listing has been answered, to write the file (a first start does not wait
for them). Taken that late, they could show a state newer than the one the answers were made
from (a package installed, a source edited during the start), and the next start would replay
the old answers under the new state's digest: so a distributions folder or a source modified
since the start (`_SLACK` before it, for file systems' coarse clocks) means no digest, and no
file; the next start records one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from .fdio import waitable

#: Bumped if what is hashed ever changes.
_VERSION = "mcp-once-replay-inputs/1"
#: The environment variable that turns replaying off (`0`, `off`, `false`, `no`).
SWITCH = "MCP_ONCE_REPLAY"
#: The largest file an option may name for a start to be replayed (larger: never replayed).
_FILE_MAX = 4 << 20
#: Who else reads the environment that shapes the answers.
_ENVIRONMENT = ("FASTMCP_", "MCP_ONCE_")
#: mcp-once's own packages, whose sources are stat-ed, and the folder they are in.
_OWN = ("mcp_once", "idempotency", "orchestrator")
_ROOT = Path(__file__).resolve().parents[2]
#: How long before the start a late input's change still counts as during it (coarse clocks).
_SLACK = 100_000_000  # ns


def enabled() -> bool:
    """Whether replaying is on (`MCP_ONCE_REPLAY` unset, or not one of 0/off/false/no)."""
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def eligible() -> bool:
    """Whether the proxy's stdin and stdout are what the stdio front serves on the event loop (a
    pipe or a socket, as fds 0 and 1): only then are the caller's lines read here handed on."""
    try:
        if sys.stdin.fileno() != 0 or sys.stdout.fileno() != 1:
            return False
    except (OSError, ValueError, AttributeError):
        return False
    return waitable(0, terminal=False) and waitable(1, terminal=False)


def _distributions(since: int) -> list[str] | None:
    """The `.dist-info` names on `sys.path`; None if a folder holding some changed `since`."""
    names: list[str] = []
    for entry in sys.path:
        with contextlib.suppress(OSError):
            folder = entry or "."
            found = [n for n in os.listdir(folder) if n.endswith(".dist-info")]
            if found and os.stat(folder).st_mtime_ns >= since:
                return None
            names.extend(found)
    return sorted(names)


def _sources(since: int) -> list[tuple[str, int, int]] | None:
    """The stat of mcp-once's own sources; None if one changed `since`."""
    found: list[tuple[str, int, int]] = []
    for package in _OWN:
        for folder, _, files in os.walk(_ROOT / package):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with contextlib.suppress(OSError):
                        info = os.stat(path)
                        if info.st_mtime_ns >= since:
                            return None
                        found.append((path, info.st_mtime_ns, info.st_size))
    return sorted(found)


class Static:
    """This start's static inputs (the module doc): the cheap ones taken when made, at the
    start; `digest()` adds the distributions and the sources the first time it is asked."""

    def __init__(self, cheap: dict[str, object]) -> None:
        self._cheap = cheap
        self._since = time.time_ns() - _SLACK
        self._digest: str | None = None
        self._taken = False

    def digest(self) -> str | None:
        """The digest of everything (computed once); None when the distributions or the
        sources changed since the start (nothing recorded)."""
        if not self._taken:
            self._taken = True
            distributions = _distributions(self._since)
            sources = None if distributions is None else _sources(self._since)
            if sources is not None:
                parts = {**self._cheap, "distributions": distributions, "sources": sources}
                text = json.dumps([_VERSION, parts], sort_keys=True, separators=(",", ":"))
                self._digest = hashlib.sha256(text.encode()).hexdigest()
        return self._digest


def static_inputs(files: Iterable[str]) -> Static | None:
    """This start's static inputs (see the module doc); `files`: the files its options name.
    None when one is too large to hash (never replayed)."""
    contents: list[tuple[str, str | None]] = []
    # FastMCP's settings read a dotenv file too (`FASTMCP_ENV_FILE`, else `.env` here).
    for name in [*files, os.environ.get("FASTMCP_ENV_FILE", ".env")]:
        try:
            if os.path.getsize(name) > _FILE_MAX:
                return None
            contents.append((name, hashlib.sha256(Path(name).read_bytes()).hexdigest()))
        except OSError:
            contents.append((name, None))
    environment = sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENVIRONMENT))
    cheap: dict[str, object] = {
        "python": [sys.version, sys.executable, list(sys.path)],
        "argv": list(sys.argv),
        "cwd": os.getcwd(),
        "files": contents,
        "environment": environment,
    }
    return Static(cheap)
