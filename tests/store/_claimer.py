"""A separate OS process that opens its own store and claims one key, for the cross-process test.

Usage: python _claimer.py sqlite|redis LOCATION PREFIX KEY FINGERPRINT
Prints "ready" once its store answers, claims when a line arrives on stdin (the start barrier),
then prints the outcome as one JSON line.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import anyio.to_thread


async def main(kind: str, location: str, prefix: str, key: str, fingerprint: str) -> None:
    store: Any
    if kind == "sqlite":
        from idempotency import SQLiteKeyStore

        store = SQLiteKeyStore(location)
    else:
        from idempotency import RedisKeyStore

        store = RedisKeyStore.from_url(location, prefix=prefix)
    try:
        await store.get(key)  # connect and open before the barrier, so the claims collide
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        outcome = await store.claim(key, fingerprint, lease=60.0, takeover=False)
        print(
            json.dumps(
                {"status": str(outcome.status), "token": outcome.token, "fence": outcome.fence}
            ),
            flush=True,
        )
    finally:
        await store.aclose()


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:6])
