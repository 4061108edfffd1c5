"""Whose task is it: a task id the proxy handed out is given only to the caller that created it.

Why: every caller's task requests go upstream on the one session that declares the tasks
extension, so the upstream cannot tell the proxy's callers apart, and a caller that learns
another caller's task id (a log, a guess, a shared dashboard) could poll its result, answer its
questions or cancel it. The proxy tells them apart as it tells their records apart (rule 7):
by the authenticated principal. So each task the proxy hands out (the record of a guarded call,
created or replayed, and a pass-through call's task alike) gets an owner record in the key
store, beside the call's record: store key `store_key({"server": ...}, TASKS_EXTENSION, taskId)`,
its fingerprint the owner's digest (`principal_digest` of the caller's access token; one
"anonymous" digest for every caller of a proxy without authentication, where records are
shared too). It lives in the store, not in the process, so that every replica on one store
answers the same; it is kept at least as long as the task (`ttlMs`), and a day at least.

`tasks/get`, `tasks/update` and `tasks/cancel` of a task id without an owner record, or whose
owner is another principal, are answered as the upstream answers an unknown task (-32602
"Task ... not found", as `fastmcp_tasks` answers a task of another scope), and not forwarded.
A store that cannot be read is -32013 (retry later), never a guess.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from fastmcp.server.dependencies import get_access_token
from mcp import MCPError
from mcp_types import INVALID_PARAMS

from idempotency import ClaimStatus, KeyStore, StoreError, principal_digest, store_key, wire
from orchestrator import TASKS_EXTENSION

logger = logging.getLogger("mcp_once.proxy")

#: How long an owner record is kept at least (seconds), and when the task names no `ttlMs`.
OWNER_RETENTION = 24 * 3600.0

#: The owner of every task a proxy without authentication hands out: its callers share one key
#: space (rule 7), and so one task space.
ANONYMOUS = hashlib.sha256(b"mcp-once/anonymous").hexdigest()

#: The lease of the claim that writes an owner record (it is completed at once).
_LEASE = 30.0


def caller() -> str:
    """The digest of the current request's principal (`ANONYMOUS` without authentication)."""
    token = get_access_token()
    return ANONYMOUS if token is None else principal_digest(token)


def unknown_task(task_id: str) -> MCPError:
    """What an unknown task's request is answered with (as `fastmcp_tasks` answers it)."""
    return MCPError(INVALID_PARAMS, f"Task {task_id} not found")


def _unavailable() -> MCPError:
    return MCPError(
        wire.STORE_UNAVAILABLE,
        "The proxy's key store could not be reached to check whose task this is; nothing was"
        " sent upstream. Retry later.",
        {"retryable": True},
    )


class TaskOwners:
    """The owner records of one proxied server's tasks (`server`: its name, as the guard scopes
    its records) in `store`; see the module doc."""

    def __init__(self, store: KeyStore, server: str) -> None:
        self.store = store
        self.server = server
        self._scope = json.dumps({"server": server, "tasks": TASKS_EXTENSION}, sort_keys=True)

    def _key(self, task_id: str) -> str:
        return store_key(self._scope, TASKS_EXTENSION, task_id)

    async def record(self, task: Any) -> None:
        """Record the current caller as the owner of `task` (a `CreateTaskResult`, as the tool
        or the guard answered it) before it is handed out. Written once: a replay finds the
        record in place. Raises -32013 when the store cannot be reached (the caller re-sends:
        a guarded call replays, and the record is written then)."""
        task_id = str(task.task_id)
        ttl_ms = getattr(task, "ttl_ms", None)
        retention = max(OWNER_RETENTION, ttl_ms / 1000 if isinstance(ttl_ms, int) else 0.0)
        owner = caller()
        key = self._key(task_id)
        try:
            found = await self.store.claim(
                key, owner, lease=_LEASE, takeover=True, tool=TASKS_EXTENSION
            )
            if found.status is ClaimStatus.CLAIMED:
                assert found.token is not None
                await self.store.complete(key, found.token, b"", retention=retention)
                return
        except StoreError as exc:
            raise _unavailable() from exc
        if found.status is ClaimStatus.MISMATCH:
            # Another principal holds this task id: the upstream reused an id, or handed one
            # task to two calls. Never hand it to a second owner.
            logger.warning(
                "task owner record %s: the upstream's task id is already another caller's;"
                " not handed out",
                key[:12],
            )
            raise unknown_task(task_id)

    async def check(self, task_id: str) -> None:
        """Refuse (as an unknown task) a request for `task_id` unless the current caller owns
        it."""
        try:
            record = await self.store.get(self._key(task_id))
        except StoreError as exc:
            raise _unavailable() from exc
        if record is None or record.fingerprint != caller():
            raise unknown_task(task_id)
