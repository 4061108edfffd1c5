"""Argument completion answered by the upstream.

FastMCP's proxy forwards tools, resources and prompts but not `completion/complete` (-32601), so a
client completing a proxied prompt's or resource template's argument got nothing. The proxy
answers it by asking the upstream on the link's one session (in front of several upstreams, the
one whose prompt or template the reference names: `gateway.py`). Completion has no effect:
nothing is guarded or stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcp_types import Completion, CompletionArgument, CompletionContext

if TYPE_CHECKING:
    from fastmcp import FastMCP
    from fastmcp.server.completions import CompletionReference

    from .upstream import UpstreamLink


async def complete_upstream(
    link: UpstreamLink,
    ref: CompletionReference,
    argument: CompletionArgument,
    context: CompletionContext | None,
) -> Completion:
    """The upstream's completion of `argument` for `ref` (named as the upstream names it)."""
    client = await link.client()
    arguments = context.arguments if context is not None else None
    named = {"name": argument.name, "value": argument.value}
    return await client.complete(ref, named, arguments)


def forward_completions(server: FastMCP[Any], link: UpstreamLink) -> None:
    """Answer `server`'s `completion/complete` requests with the upstream's answers."""

    async def complete(
        ref: CompletionReference, argument: CompletionArgument, context: CompletionContext | None
    ) -> Completion:
        return await complete_upstream(link, ref, argument, context)

    server.add_completion_handler(complete)
