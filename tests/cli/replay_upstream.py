"""A stdio MCP server in plain JSON lines, for the replay tests (`test_cli_replay.py`): what it
answers is read from a JSON file (its only argument) at each request, so a test changes the
upstream's `initialize` result or listing between two starts without changing its command line;
each `tools/call` is appended to a ledger file beside it before it is answered (the effects the
proxy cannot fake), and every message's method to a `.methods` file, with this process's id.
Plain JSON lines rather than an SDK server: it starts in ~50 ms.

The file: {"instructions": str (optional), "tools": [Tool, ...], "fail_list_after": int
(optional: the listings after that many in this process fail), "ask_roots": bool (optional: a
`roots/list` request to the client once it is initialized, as filesystem servers send)}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")


#: The listings answered so far by this process.
listed = 0


def answer(message: dict[str, Any], spec: dict[str, Any], ledger: Path) -> dict[str, Any]:
    global listed
    method = message.get("method")
    params = message.get("params") or {}
    if method == "initialize":
        asked = params.get("protocolVersion")
        result: dict[str, Any] = {
            "protocolVersion": asked if asked in VERSIONS else VERSIONS[0],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "replay-upstream", "version": "1"},
        }
        if "instructions" in spec:
            result["instructions"] = spec["instructions"]
        return {"result": result}
    if method == "tools/list":
        listed += 1
        if listed > spec.get("fail_list_after", listed):
            return {"error": {"code": -32603, "message": "the listing failed"}}
        return {"result": {"tools": spec["tools"]}}
    if method == "tools/call":
        text = str((params.get("arguments") or {}).get("text", ""))
        with ledger.open("a") as f:
            f.write(json.dumps({"tool": params.get("name"), "text": text}) + "\n")
        return {"result": {"content": [{"type": "text", "text": text}], "isError": False}}
    if method == "ping":
        return {"result": {}}
    return {"error": {"code": -32601, "message": f"no method {method}"}}


def main() -> None:
    path = Path(sys.argv[1])
    ledger = path.with_suffix(".ledger")
    methods = path.with_suffix(".methods")
    for line in sys.stdin:
        message = json.loads(line)
        with methods.open("a") as f:
            f.write(json.dumps({"pid": os.getpid(), "method": message.get("method")}) + "\n")
        spec = json.loads(path.read_text())
        if message.get("method") == "notifications/initialized" and spec.get("ask_roots"):
            ask = {"jsonrpc": "2.0", "id": "roots", "method": "roots/list"}
            sys.stdout.write(json.dumps(ask) + "\n")
            sys.stdout.flush()
        if "id" not in message or "method" not in message:
            continue  # a notification, or an answer to a request of ours
        reply = {"jsonrpc": "2.0", "id": message["id"], **answer(message, spec, ledger)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
