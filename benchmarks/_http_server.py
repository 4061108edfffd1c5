"""The benchmark MCP server as its own process, over streamable HTTP on 127.0.0.1.

`python -m benchmarks._http_server --store URL --port N`: a deployed server is a process of its
own, so the HTTP figures do not share an event loop (or a GIL) with the client measuring them.
"""

from __future__ import annotations

import argparse
import logging

import uvicorn

from idempotency import open_store

from ._servers import bench_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", required=True, help="key store URL (memory://, redis://...)")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    server = bench_server(open_store(args.store))
    uvicorn.run(
        server.streamable_http_app(),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
    )


if __name__ == "__main__":
    main()
