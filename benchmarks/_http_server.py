"""The benchmark MCP server as its own process, over streamable HTTP on 127.0.0.1.

`python -m benchmarks._http_server --store URL --port N [--uvloop]`: a deployed server is a
process of its own, so the HTTP figures do not share an event loop (or a GIL) with the client
measuring them. The event loop is pinned: asyncio unless `--uvloop` (uvicorn's default,
`loop="auto"`, would silently pick uvloop whenever it is installed).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from typing import Any

import uvicorn

from idempotency import open_store

from ._servers import bench_server


def uvicorn_options(port: int, *, uvloop: bool) -> dict[str, Any]:
    """What `uvicorn.run` is given besides the app: the loop named, never left to "auto"."""
    return {
        "host": "127.0.0.1",
        "port": port,
        "loop": "uvloop" if uvloop else "asyncio",
        "log_level": "warning",
        "access_log": False,
        "lifespan": "on",
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", required=True, help="key store URL (memory://, redis://...)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--uvloop", action="store_true", help="serve on uvloop (default: the asyncio loop)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    server = bench_server(open_store(args.store))
    uvicorn.run(server.streamable_http_app(), **uvicorn_options(args.port, uvloop=args.uvloop))


if __name__ == "__main__":
    main()
