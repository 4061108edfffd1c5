"""Argument completion answered by the upstream.

FastMCP's proxy forwards tools, resources and prompts but not `completion/complete` (-32601), so a
client completing a proxied prompt's or resource template's argument got nothing. The proxy
answers it by asking the upstream on the link's one session. Completion has no effect: nothing is
guarded or stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcp_types import Completion, CompletionArgument, CompletionContext

if TYPE_CHECKING:
    from fastmcp import FastMCP
    from fastmcp.server.completions import CompletionReference

    from .upstream import UpstreamLink


def forward_completions(server: FastMCP[Any], link: UpstreamLink) -> None:
    """Answer `server`'s `completion/complete` requests with the upstream's answers."""

    async def complete(
        ref: CompletionReference, argument: CompletionArgument, context: CompletionContext | None
    ) -> Completion:
        client = await link.client()
        arguments = context.arguments if context is not None else None
        named = {"name": argument.name, "value": argument.value}
        return await client.complete(ref, named, arguments)

    server.add_completion_handler(complete)
