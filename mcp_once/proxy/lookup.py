"""The proxy's tool lookup: FastMCP's own, made cheaper in two ways that change no answer.

Every `tools/call` asks FastMCP for its tool (visibility, component auth, versions: FastMCP's
`get_tool`). That lookup was the largest single cost left on a guarded call over stdio
(benchmarks/README.md, "The tool lookup in turn"):

- **once per call** (`looked_up`, `PerCall`): one call asks for its tool up to four times (the
  fast path's choice, the proxy's guard choice, the guard's own lookup, FastMCP's run), each a
  pass through every provider and transform. The first answer is kept for the call being served,
  while the middleware is the proxy's own, which changes nothing a lookup depends on mid-call.
- **the providers asked in turn** (`in_turn`): FastMCP's aggregate asks its providers (the
  proxy's: the local one, empty, and the upstream's) concurrently, in a task group with a task per
  provider (`fastmcp.utilities.async_utils.gather`), which is two task spawns and a task group on
  every call. The local provider never waits, so asking it first and then the upstream's gives
  the same answers, errors and order, as soon, without the tasks. Only those two are asked in
  turn (`own_providers`): a server a user mounted more on keeps FastMCP's lookup, where two
  upstreams' listings may overlap. `in_turn` is
  `FastMCP._get_tool` and `AggregateProvider._get_tool` (fastmcp 4.1.6) with the gather written
  as a loop; `tests/proxy/test_proxy_lookup.py` pins their sources, so an upgrade that changes
  either fails there and asks for this copy to be read again, and holds the answers equal to
  FastMCP's own lookup's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, cast

from fastmcp.server.server import _component_auth_allows

if TYPE_CHECKING:
    from fastmcp import FastMCP
    from fastmcp.server.providers import Provider
    from fastmcp.tools.base import Tool

#: The tools FastMCP found for the `tools/call` being served, by name (see the module doc).
_lookups: ContextVar[dict[str, Tool | None] | None] = ContextVar("mcp_once_lookups", default=None)


class PerCall:
    """Lookups inside the block are asked once per name (the `tools/call` being served). A class,
    not a generator: it is entered on every call."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _lookups.set({})

    def __exit__(self, *exc: object) -> None:
        _lookups.reset(self._token)


async def looked_up(
    name: str, version: Any, lookup: Callable[[str, Any], Awaitable[Tool | None]]
) -> Tool | None:
    """`lookup(name, version)`, asked once per `tools/call` being served (`PerCall`)."""
    memo = _lookups.get()
    if memo is None or version is not None:
        return await lookup(name, version)
    if name not in memo:
        memo[name] = await lookup(name, None)
    return memo[name]


def own_providers(server: FastMCP[Any], upstream: Provider) -> bool:
    """Whether `server`'s providers are its own local one and `upstream`'s, nothing added."""
    providers = server.providers
    return (
        len(providers) == 2 and providers[0] is server._local_provider and providers[1] is upstream
    )


async def in_turn(server: FastMCP[Any], name: str, version: Any = None) -> Tool | None:
    """`FastMCP._get_tool(name, version)` with the providers asked one after the other: the
    highest version any provider has (a provider's error as FastMCP's error strategy treats it,
    a `NotFoundError` as no tool), if the component's own `auth` admits the current request."""
    results: list[Any] = []
    for provider in server.providers:
        try:
            results.append(await provider.get_tool(name, version))
        except Exception as exc:  # as gather(return_exceptions=True) hands it on
            results.append(exc)
    tool = cast("Tool | None", server._get_highest_version_result(results, f"get_tool({name!r})"))
    if tool is None:
        return None
    return tool if await _component_auth_allows(tool) else None
