"""An upstream for the proxy's exit tests: `python exit_server.py PID_FILE [--ignore-eof]` (stdio).

Writes its pid to PID_FILE before it serves, so a test can tell by pid whether it is still
running after the proxy is gone. `--ignore-eof`: a non-daemon thread keeps the process alive
after its stdin closes (a server that does not exit on EOF), until a signal ends it.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("exit-server")


@server.tool()
def echo(text: str) -> str:
    return text


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(str(os.getpid()))
    if "--ignore-eof" in sys.argv[2:]:
        threading.Thread(target=threading.Event().wait, name="ignores-eof").start()
    server.run()
