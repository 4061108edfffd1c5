"""What a stdio proxy's first answers depend on besides its caller and its upstream child: the
`static` part of a replay's inputs (`replay.py`), and where a replay may serve at all.

Why a module of its own: this is the list a reviewer checks against "what can change FastMCP's
answers", kept apart from the mechanics of answering. Hashed, each cheaply (~2 ms of CPU in all,
before FastMCP is imported): the Python build and `sys.path`; the distributions installed there
(their `.dist-info` directory names: versions, without `importlib.metadata`'s ~40 ms); the stat of
every source file of mcp-once's own packages (an editable checkout changes without a version);
the proxy's whole command line and working directory; the contents of the files its options name
(policy, config, token files) and of FastMCP's dotenv file (`FASTMCP_ENV_FILE`, else `.env`,
which its settings read); and the `FASTMCP_*` / `MCP_ONCE_*` environment (values only hashed,
never stored).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
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
#: mcp-once's own packages, whose sources are stat-ed (next to this package).
_OWN = ("mcp_once", "idempotency", "orchestrator")


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


def _distributions() -> list[str]:
    names: list[str] = []
    for entry in sys.path:
        with contextlib.suppress(OSError):
            names.extend(n for n in os.listdir(entry or ".") if n.endswith(".dist-info"))
    return sorted(names)


def _sources() -> list[tuple[str, int, int]]:
    root = Path(__file__).resolve().parents[2]
    found: list[tuple[str, int, int]] = []
    for package in _OWN:
        for folder, _, files in os.walk(root / package):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with contextlib.suppress(OSError):
                        info = os.stat(path)
                        found.append((path, info.st_mtime_ns, info.st_size))
    return sorted(found)


def static_digest(files: Iterable[str]) -> str | None:
    """The digest of what the proxy's answers depend on besides its caller and its child (see
    the module doc); `files`: the files its options name. None when one is too large to hash."""
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
    parts = {
        "python": [sys.version, sys.executable, sys.path],
        "distributions": _distributions(),
        "sources": _sources(),
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "files": contents,
        "environment": environment,
    }
    text = json.dumps([_VERSION, parts], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
