"""The payments server of `examples/reconcile.py` as an app object, `payments:server`: what
`mcp-once keys reconcile --app payments:server` imports (run it in this directory, as uvicorn
imports an app from the working directory; docs/runbook.md).

Your own server's module is the same few lines: build the server object at import, on the key
store its replicas use, with its `reconcile=`. Here the key store is `$MCP_ONCE_STORE` (the one
the `mcp-once` commands read; the same default as theirs) and the payment provider
`$PAYMENT_PROVIDER_URL` (`examples/payment_provider.py` prints its URL when it starts).
"""

from __future__ import annotations

import os

from payment_provider import ProviderClient
from reconcile import build

from idempotency import open_store

STORE = os.environ.get("MCP_ONCE_STORE") or "sqlite:///.mcp-once/keys.sqlite3"
PROVIDER = os.environ.get("PAYMENT_PROVIDER_URL")
if not PROVIDER:
    raise RuntimeError(
        "set $PAYMENT_PROVIDER_URL to the payment provider's URL (examples/payment_provider.py"
        " prints it): the reconciler asks the provider"
    )

server = build(open_store(STORE), ProviderClient(PROVIDER))
