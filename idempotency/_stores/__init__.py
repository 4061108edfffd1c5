"""The key stores: where records live, one backend per module (or folder), all behind one protocol.

The guard speaks only to `store.KeyStore`; nothing here imports the guard or the framework
integrations above it. What lives where:

- `store.py`: the contract every backend obeys (the `KeyStore` protocol, `Record`,
  `ClaimOutcome`, the store errors, size limits) and the side channel for unreadable records;
- `transitions.py`: the record's state machine as pure functions, applied by the in-process
  backends and mirrored by the Redis scripts;
- `memory.py` (`MemoryKeyStore`), `sqlite.py` (`SQLiteKeyStore`), `redis/` (`RedisKeyStore`,
  with its connection layer, Cluster, Sentinel and Lua scripts);
- `open.py`: `open_store(url)`, one configuration string to pick a backend.

Public names are re-exported from `idempotency`; these modules are private.
"""
