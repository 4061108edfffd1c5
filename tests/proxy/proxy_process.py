"""The proxy as a process of its own through the Python API, with a lease short enough for a test:
`python proxy_process.py STORE_URL LEASE PID_FILE -- COMMAND ARGS...` (stdio front). Writes its
pid to PID_FILE once started, so a test can SIGKILL it mid-call."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from idempotency import open_store
from mcp_once.proxy import Upstream, build_proxy


def main() -> None:
    store, lease, pid_file, separator, *command = sys.argv[1:]
    assert separator == "--" and command
    Path(pid_file).write_text(str(os.getpid()))
    proxy = build_proxy(Upstream.stdio(*command), open_store(store), lease=float(lease))
    proxy.run(transport="stdio", show_banner=False)


if __name__ == "__main__":
    main()
