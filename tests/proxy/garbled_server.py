"""A stdio upstream that has its effect and then answers garbled: `python garbled_server.py
LEDGER`. Raw JSON-RPC, no SDK (an SDK server cannot send a malformed result): `pay` appends to
LEDGER (fsynced before it answers, so what is counted is what happened), then answers a
`tools/call` result whose `content` is not a list, which the proxy's upstream session refuses as
invalid. What a proxy must do with it: the effect may have happened, so the key's answer is that
failure, stored, never a second run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

LEDGER = Path(sys.argv[1])
TOOL = {
    "name": "pay",
    "inputSchema": {"type": "object", "properties": {"amount": {"type": "integer"}}},
}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    method = request.get("method")
    params = request.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "garbled", "version": "1.0"},
        }
    if method == "tools/list":
        return {"tools": [TOOL]}
    if method == "tools/call":
        with LEDGER.open("a") as ledger:
            ledger.write(json.dumps(params.get("arguments")) + "\n")
            ledger.flush()
            os.fsync(ledger.fileno())
        return {"content": "garbled"}
    return {}


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        if "id" not in request:
            continue  # a notification
        if request.get("method") not in ("initialize", "tools/list", "tools/call", "ping"):
            reply: dict[str, Any] = {"code": -32601, "message": "Method not found"}
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "error": reply}))
        else:
            result = answer(request)
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}))
        sys.stdout.write("\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
