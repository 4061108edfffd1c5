"""`npm_install` (tests/npm_install.py) from two processes at once, as two xdist workers on a
clean checkout call it: one installs, the other waits for it and finds the stamp."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent

#: A stand-in for npm: notes each run, then waits for `go` before it "installs" (`$3`: the
#: prefix, after `install --prefix`), so the test decides when the first install ends.
_FAKE_NPM = """#!/bin/sh
echo run >> "{runs}"
while [ ! -e "{go}" ]; do sleep 0.01; done
mkdir -p "$3/node_modules/pkg"
"""

_CALL = (
    "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path;"
    " from npm_install import npm_install;"
    " npm_install(Path(sys.argv[2]), ['pkg@1.0.0'], lambda reason: sys.exit(reason))"
)


def _blocked_flock_waiters() -> int:
    """How many processes wait for a flock right now (`/proc/locks` marks a waiter `->`)."""
    return sum(1 for line in Path("/proc/locks").read_text().splitlines() if "-> FLOCK" in line)


def test_two_processes_installing_one_prefix_run_npm_once(tmp_path: Path) -> None:
    runs, go = tmp_path / "runs", tmp_path / "go"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    npm = bin_dir / "npm"
    npm.write_text(_FAKE_NPM.format(runs=runs, go=go))
    npm.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    prefix = tmp_path / "cache" / "npm"
    argv = [sys.executable, "-c", _CALL, str(HERE), str(prefix)]
    first = subprocess.Popen(argv, env=env)
    second = None
    try:
        deadline = time.monotonic() + 60
        while not runs.exists():  # the first install is running
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        waiters = _blocked_flock_waiters()
        second = subprocess.Popen(argv, env=env)
        # Until the second either waits for the first (a new flock waiter) or runs npm itself.
        while _blocked_flock_waiters() <= waiters and runs.read_text().count("run") < 2:
            assert second.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        go.touch()
        assert first.wait(60) == 0 and second.wait(60) == 0
    finally:
        go.touch()
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
    assert runs.read_text().count("run") == 1
    assert (prefix / "node_modules" / "pkg").is_dir()
