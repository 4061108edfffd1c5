"""mcp-once, server side: idempotency keys, fenced leases and replays for MCP tools."""

from ._memory_store import MemoryKeyStore
from ._store import (
    ClaimOutcome,
    ClaimStatus,
    CorruptRecord,
    KeyStore,
    LimitExceeded,
    Record,
    RecordState,
    StoreError,
    StoreUnavailable,
)

__all__ = [
    "ClaimOutcome",
    "ClaimStatus",
    "CorruptRecord",
    "KeyStore",
    "LimitExceeded",
    "MemoryKeyStore",
    "Record",
    "RecordState",
    "StoreError",
    "StoreUnavailable",
]
