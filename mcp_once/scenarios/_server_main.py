"""The chaos workload server in a process of its own (`python -m mcp_once.scenarios._server_main`).

Process-level faults (kill -9, SIGSTOP) need the server in another process; the ledger file and
the key store URL are how that process shares what the checker reads.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from mcp_once.scenarios._ledger import Ledger
from mcp_once.scenarios._shop import build_server


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mcp_once.scenarios._server_main")
    parser.add_argument("--transport", choices=["stdio", "http"], required=True)
    parser.add_argument("--ledger", required=True, help="the ledger's SQLite file")
    parser.add_argument("--store", default=None, help="key store URL; omit for the baseline")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--name", default="chaos-shop")
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--wait", type=float, default=10.0)
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--retention", type=float, default=None)
    parser.add_argument("--reconcile", action="store_true", help="pay asks the ledger (rule 19)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    from idempotency import open_store

    ledger = Ledger(args.ledger)
    store = open_store(args.store) if args.store else None
    server = build_server(
        store,
        ledger,
        name=args.name,
        lease=args.lease,
        wait=args.wait,
        hold=args.hold,
        retention=args.retention,
        reconcile=args.reconcile,
    )
    ledger.event("server_up")
    if args.transport == "stdio":
        server.run("stdio")
        return 0
    import uvicorn

    config = uvicorn.Config(
        server.streamable_http_app(),
        host="127.0.0.1",
        port=args.port,
        log_level="error",
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
