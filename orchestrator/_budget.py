"""A retry budget shared by every call to one server.

Per-call limits (attempts, deadline) cannot stop a fleet of callers from tripling the load on a
server that is already failing: each caller sees only its own call. A token bucket shared across
calls is what bounds the aggregate (gRPC retry throttling, gRFC A6): every failed attempt spends a
token, every success earns back a fraction of one, and retries are allowed only while the bucket
is more than half full. Once failures exceed roughly `token_ratio` of attempts the bucket drains
and calls get one attempt each, so a full outage costs about 1.0x the calls instead of
`max_attempts`x.
"""

from __future__ import annotations

import math
import threading


class RetryBudget:
    """Token bucket deciding whether any retry to one server is allowed right now.

    Share one instance between every call (and task, and thread) that talks to the same server.
    The methods never await, so under anyio each is atomic within one event loop; a lock makes
    them safe across threads too.
    """

    def __init__(self, max_tokens: float = 10.0, token_ratio: float = 0.1) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int | float):
            raise TypeError(f"max_tokens must be a number, not {type(max_tokens).__name__}")
        if isinstance(token_ratio, bool) or not isinstance(token_ratio, int | float):
            raise TypeError(f"token_ratio must be a number, not {type(token_ratio).__name__}")
        if not math.isfinite(max_tokens) or not 0 < max_tokens <= 1000:
            raise ValueError(f"max_tokens must be in (0, 1000], got {max_tokens!r}")
        if not math.isfinite(token_ratio) or not 0 < token_ratio <= 1:
            raise ValueError(f"token_ratio must be in (0, 1], got {token_ratio!r}")
        self._max = float(max_tokens)
        self._ratio = float(token_ratio)
        self._tokens = float(max_tokens)
        self._lock = threading.Lock()

    @property
    def max_tokens(self) -> float:
        return self._max

    @property
    def token_ratio(self) -> float:
        return self._ratio

    @property
    def tokens(self) -> float:
        with self._lock:
            return self._tokens

    def record_failure(self) -> None:
        """Spend a token: an attempt failed in a way that says the server is unwell."""
        with self._lock:
            self._tokens = max(0.0, self._tokens - 1.0)

    def record_success(self) -> None:
        """Earn back `token_ratio` of a token: the server answered."""
        with self._lock:
            self._tokens = min(self._max, self._tokens + self._ratio)

    def allows_retry(self) -> bool:
        """Whether a retry may be sent now (the bucket is more than half full)."""
        with self._lock:
            return self._tokens > self._max / 2

    def __repr__(self) -> str:
        return (
            f"RetryBudget(max_tokens={self._max:g}, token_ratio={self._ratio:g},"
            f" tokens={self.tokens:.3g})"
        )
