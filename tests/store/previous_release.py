"""Run by `test_previous_release_reads.py` in a process whose `idempotency` is the release before
histories (extracted from git onto PYTHONPATH): it reads and writes a store this release wrote,
through that release's own store API only, and prints what it saw as one JSON object.

Usage: python previous_release.py STORE_URL KEYS_JSON (KEYS_JSON: {"done": store key, ...}).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

import idempotency
from idempotency import open_store

FINGERPRINT = "f" * 64
OTHER_FINGERPRINT = "e" * 64
RESULT = b'{"format":1,"executedAt":1.5,"result":{"content":[]}}'


async def main(url: str, keys: dict[str, str]) -> dict[str, Any]:
    store = open_store(url)
    seen: dict[str, Any] = {"package": idempotency.__file__}
    try:
        for name, key in keys.items():
            record = await store.get(key)
            seen[f"get {name}"] = None if record is None else {
                "state": record.state.value,
                "fence": record.fence,
                "expires": record.expires_at,
                "result": None if record.result is None else record.result.decode(),
                "tool": record.tool,
            }  # fmt: skip
        for name in ("done", "settled", "taken", "busy", "unknown", "orphan"):
            claim = await store.claim(keys[name], FINGERPRINT, lease=30, takeover=False)
            seen[f"claim {name}"] = {
                "status": claim.status.value,
                "result": None if claim.result is None else claim.result.decode(),
            }
        reused = await store.claim(keys["done"], OTHER_FINGERPRINT, lease=30, takeover=False)
        seen["claim done, other arguments"] = reused.status.value
        # A released record runs again, and what this release stores replays; so does a new key.
        for name in ("released", "new"):
            claim = await store.claim(keys[name], FINGERPRINT, lease=30, takeover=False)
            assert claim.token is not None, claim
            completed = await store.complete(keys[name], claim.token, RESULT, retention=600)
            replay = await store.claim(keys[name], FINGERPRINT, lease=30, takeover=False)
            seen[f"run {name}"] = {
                "claimed": claim.status.value,
                "completed": completed,
                "replay": replay.status.value,
                "result": None if replay.result is None else replay.result.decode(),
            }
        listed = await store.list_records(limit=1000)
        seen["listed"] = sorted(record.key for record in listed)
    finally:
        await store.aclose()
    return seen


if __name__ == "__main__":
    print(json.dumps(anyio.run(main, sys.argv[1], json.loads(sys.argv[2]))))
