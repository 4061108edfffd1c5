"""How a client config starts this same `mcp-once`: the words `wrap` writes before `proxy`.

Desktop clients do not read the shell's PATH (they start from the desktop, with a PATH of their
own), so `"command": "mcp-once"` works in a terminal and fails in Claude Desktop. `wrap` writes
what runs the installation that is running now, by absolute path:

- run as the console script (`mcp-once wrap ...`, a venv's, pipx's, `uv tool install`'s): that
  script's path as it was started, symlinks kept (pipx's `~/.local/bin/mcp-once` survives an
  upgrade, the venv path behind it does not);
- run as `python -m mcp_once`: the console script beside that interpreter, else the interpreter
  itself with `-m mcp_once`;
- run by `uvx` (its environment lives in uv's cache, which `uv cache clean` deletes): the `uvx`
  launcher by absolute path, pinned to the version that is running
  (`uvx --from 'mcp-once[fastmcp]==X.Y.Z' mcp-once`, or the URL it was installed from), so each
  start is the same proxy, from uv's cache when it is there.

Not `shutil.which("mcp-once")`: the first one on PATH may be another installation than the one
that wrapped (and checked) the entries.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

_SCRIPT_NAMES = ("mcp-once", "mcp-once.exe")
#: The folders of uv's cache that hold the throwaway environments `uvx` runs tools in.
_UV_CACHE_BUCKET = re.compile(r"^(?:archive|environments)-v\d+$")


@dataclass(frozen=True, slots=True)
class Launcher:
    """The words that start `mcp-once` (the command, then arguments before `proxy`), and how
    they were found, for the report."""

    words: tuple[str, ...]
    how: str


def _requirement() -> str:
    """What `uvx --from` installs: this version of mcp-once with the proxy's extra (or the URL
    it was installed from, PEP 610)."""
    try:
        distribution = metadata.distribution("mcp-once")
    except metadata.PackageNotFoundError:
        return "mcp-once[fastmcp]"
    origin = distribution.read_text("direct_url.json")
    url = json.loads(origin).get("url") if origin else None
    if isinstance(url, str):
        return f"mcp-once[fastmcp] @ {url}"
    return f"mcp-once[fastmcp]=={distribution.version}"


def _uvx(environ: Mapping[str, str]) -> list[str] | None:
    """`uvx` by absolute path: beside the `uv` that started us (uv names itself in `$UV` for the
    processes it starts), else on PATH; `uv tool run` where there is no `uvx`."""
    uv = environ.get("UV")
    if uv:
        beside = Path(uv).with_name("uvx.exe" if uv.endswith(".exe") else "uvx")
        return [str(beside)] if beside.is_file() else [uv, "tool", "run"]
    found = shutil.which("uvx", path=environ.get("PATH"))
    return [os.path.abspath(found)] if found else None


def find_launcher(
    argv0: str | None = None,
    executable: str | None = None,
    prefix: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Launcher:
    """The launcher of the running `mcp-once` (the arguments default to this process's)."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    executable = sys.executable if executable is None else executable
    prefix = sys.prefix if prefix is None else prefix
    environ = os.environ if environ is None else environ
    if any(_UV_CACHE_BUCKET.match(part) for part in Path(prefix).parts):
        uvx = _uvx(environ)
        if uvx is not None:
            return Launcher((*uvx, "--from", _requirement(), "mcp-once"), "uvx, pinned")
    if Path(argv0).name in _SCRIPT_NAMES:
        return Launcher((os.path.abspath(argv0),), "this console script")
    beside = Path(executable).with_name(_SCRIPT_NAMES[os.name == "nt"])
    if beside.is_file():
        return Launcher((str(beside),), "the console script beside this Python")
    return Launcher((executable, "-m", "mcp_once"), "this Python, -m mcp_once")
