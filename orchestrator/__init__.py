"""mcp-once, client side: annotation-gated, keyed retries for MCP tool calls."""

from ._budget import RetryBudget
from ._http import (
    RetryAwareTransport,
    http_client_factory,
    streamable_http_transport,
)
from ._key import derive_key, mint_key
from ._outcome import (
    InvalidParams,
    KeyReused,
    NotExecuted,
    OutcomeUnknown,
    ServerOutcomeUnknown,
    ToolCallError,
)
from ._policy import MAX_ATTEMPTS_CEILING, Override, RetryPolicy
from ._reconnect import Connect, ReconnectFailed
from ._report import AttemptReport, CallOutcome, CallReport, FailureKind, GiveUpReason
from ._session import RetryingSession
from ._sessions import SessionLike, ToolSession
from ._testing import testing

__all__ = [
    "MAX_ATTEMPTS_CEILING",
    "AttemptReport",
    "CallOutcome",
    "CallReport",
    "Connect",
    "FailureKind",
    "GiveUpReason",
    "InvalidParams",
    "KeyReused",
    "NotExecuted",
    "OutcomeUnknown",
    "Override",
    "ReconnectFailed",
    "RetryAwareTransport",
    "RetryBudget",
    "RetryPolicy",
    "RetryingSession",
    "ServerOutcomeUnknown",
    "SessionLike",
    "ToolCallError",
    "ToolSession",
    "derive_key",
    "http_client_factory",
    "mint_key",
    "streamable_http_transport",
    "testing",
]
