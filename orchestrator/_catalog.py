"""The server's tool list, cached: where the retry gate reads a tool's annotations.

Listing is cheap to keep: the SDK itself lists tools before the first call to an unlisted tool (to
validate its output), and listing through the same session feeds that cache, so a warm catalog
costs no extra round trip. The cache follows pagination, refreshes on a miss (a tool added since)
and on `notifications/tools/list_changed` when the session lets us hear them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import anyio
from mcp_types import Tool

from idempotency import wire

from ._sessions import SessionLike, tool_session

logger = logging.getLogger("orchestrator")

#: Pages followed in one listing: a server whose cursors never end cannot hang a call.
PAGE_CAP = 100


async def list_all_tools(session: SessionLike) -> list[Tool]:
    """Every tool the server lists, following `next_cursor` (bounded, cycle-safe)."""
    tools: list[Tool] = []
    cursor: str | None = None
    seen: set[str] = set()
    lister = tool_session(session)
    for _ in range(PAGE_CAP):
        page = await lister.list_tools_page(cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None or cursor in seen:
            break
        seen.add(cursor)
    return tools


class ToolCatalog:
    """Name -> `Tool` for one server, shared by every call through one `RetryingSession`."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._version = 0
        self._stale = True
        self._lock = anyio.Lock()

    @property
    def refreshes(self) -> int:
        """How many listings have completed (for tests and diagnostics)."""
        return self._version

    def get(self, name: str) -> Tool | None:
        """The tool as last listed, fresh or not."""
        return self._tools.get(name)

    def fresh(self, name: str) -> Tool | None:
        """The tool, only if the listing is not known to be out of date."""
        return None if self._stale else self._tools.get(name)

    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    def invalidate(self) -> None:
        """Forget freshness: the next lookup lists again (the server's tools changed)."""
        self._stale = True

    async def lookup(self, session: SessionLike, name: str) -> Tool | None:
        """The tool named `name`, listing the server first if it is unknown or the list is stale."""
        version = self._version
        if (tool := self.fresh(name)) is not None:
            return tool
        await self.refresh(session, seen_version=version)
        return self._tools.get(name)

    async def refresh(self, session: SessionLike, *, seen_version: int | None = None) -> None:
        """List the server's tools; concurrent refreshes share one listing."""
        async with self._lock:
            if seen_version is not None and self._version != seen_version:
                return  # another task listed while this one waited
            tools = await list_all_tools(session)
            self._tools = {tool.name: tool for tool in tools}
            self._version += 1
            self._stale = False


def watch_list_changed(session: SessionLike, on_change: Callable[[], None]) -> bool:
    """Call `on_change` whenever the session receives `notifications/tools/list_changed`.

    Best effort (it hooks SDK internals): returns False when the hook is not available.
    """
    return tool_session(session).watch_list_changed(on_change)


def _policy_entry(tool: Tool | None) -> Mapping[str, Any]:
    """The tool's listing `_meta` entry (its idempotency policy); empty when it has none."""
    entry = (tool.meta or {}).get(wire.IDEMPOTENCY_META) if tool is not None else None
    return entry if isinstance(entry, Mapping) else {}


def advertised_key_argument(tool: Tool | None) -> tuple[str, ...] | None:
    """The path of the argument the server also takes this tool's key from (`keyArgument` in
    the listing's `_meta`, dotted for nested objects), as segments; None when it names none or
    names it in a form this client cannot read (then the key travels in `_meta` only)."""
    path = _policy_entry(tool).get(wire.DEFINITION_KEY_ARGUMENT)
    if path is None:
        return None
    try:
        return wire.argument_path(path)
    except (TypeError, ValueError):
        logger.debug("ignoring an unreadable %s: %r", wire.DEFINITION_KEY_ARGUMENT, path)
        return None


def advertised_retention(tool: Tool | None) -> float | None:
    """The seconds the server says it keeps a key of this tool (`retentionSeconds` in the
    listing's `_meta`), or None when it says nothing."""
    seconds = _policy_entry(tool).get("retentionSeconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return None
    return float(seconds) if math.isfinite(seconds) and seconds >= 0 else None
