"""`npm install` of pinned packages into a folder of the test cache, once per set of pins: what
every test that runs an npm package (a client, a reference server) uses, never a global install.

A stamp naming the packages marks a finished install, so a later session (or a broken earlier
one) is recognised. Without npm, or when the install fails, `fail` is called with the reason (the
callers pass `unavailable`-based functions: a loud skip, a failure under CI).

The install holds an exclusive lock on a file beside `prefix` (`flock`): on a clean checkout
every xdist worker's session fixture finds no stamp at once, and without the lock a second worker
removed and reinstalled the folder while the first one's tests ran node from it ("Cannot find
module '@modelcontextprotocol/sdk/...'": a clean-clone CI run, 2026-12-07). With it, the others
wait and then find the stamp.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


def npm_install(prefix: Path, packages: list[str], fail: Callable[[str], NoReturn]) -> None:
    """Install `packages` (each `name@version`) into `prefix`, unless already there (one process
    at a time: see the module doc)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with (prefix.parent / f".{prefix.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        _install(prefix, packages, fail)


def _install(prefix: Path, packages: list[str], fail: Callable[[str], NoReturn]) -> None:
    stamp = prefix / "installed.json"
    if stamp.exists() and json.loads(stamp.read_text()) == packages:
        return
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.mkdir(parents=True)
    npm = shutil.which("npm")
    if npm is None:
        fail("npm is not on PATH")
    command = [npm, "install", "--prefix", str(prefix), "--no-save", "--no-audit", "--no-fund"]
    try:
        done = subprocess.run(
            [*command, "--loglevel=error", *packages], capture_output=True, text=True, timeout=600
        )
    except subprocess.TimeoutExpired:
        fail(f"npm install {' '.join(packages)} did not finish within 600 s")
    if done.returncode != 0:
        fail(f"npm install {' '.join(packages)} failed: {done.stderr[-2000:]}")
    stamp.write_text(json.dumps(packages))
