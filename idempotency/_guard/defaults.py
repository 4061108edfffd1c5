"""The default lease, apart from `Policy` (whose module loads the SDK), so that operator tooling
counts its grace periods in it without loading the SDK (`mcp-once keys settle --grace`)."""

from __future__ import annotations

#: `Policy.lease`'s default, in seconds (public: operator tooling counts grace periods in it).
#: Renewed every 10 s while the tool runs; a crashed worker blocks its key for at most ~30 s
#: (Powertools: 1 h), yet a store hiccup or a pause of a few seconds does not lose the claim.
DEFAULT_LEASE = 30.0
