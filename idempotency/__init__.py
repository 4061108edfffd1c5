"""mcp-once, server side: idempotency keys, fenced leases and replays for MCP tools."""

from ._guard.current_claim import Claim, current_claim
from ._guard.fingerprint import fingerprint
from ._guard.mint import KeySource
from ._guard.policy import KeyMode, Policy, PolicyOptions
from ._guard.replay import decode_result, encode_result
from ._guard.scope import CallScope, ScopeFn, default_scope
from ._integrations.lowlevel import GuardedCallTool, idempotent_call_tool
from ._integrations.mcpserver.decorator import idempotent
from ._integrations.mcpserver.install import install
from ._stores.memory import MemoryKeyStore
from ._stores.open import open_store
from ._stores.redis.store import DurabilityUnsupported, RedisKeyStore, ReplicationUnconfirmed
from ._stores.sqlite import SQLiteKeyStore
from ._stores.store import (
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
    "CallScope",
    "Claim",
    "ClaimOutcome",
    "ClaimStatus",
    "CorruptRecord",
    "DurabilityUnsupported",
    "GuardedCallTool",
    "KeyMode",
    "KeySource",
    "KeyStore",
    "LimitExceeded",
    "MemoryKeyStore",
    "Policy",
    "PolicyOptions",
    "Record",
    "RecordState",
    "RedisKeyStore",
    "ReplicationUnconfirmed",
    "SQLiteKeyStore",
    "ScopeFn",
    "StoreError",
    "StoreUnavailable",
    "current_claim",
    "decode_result",
    "default_scope",
    "encode_result",
    "fingerprint",
    "idempotent",
    "idempotent_call_tool",
    "install",
    "open_store",
]
