"""An MCP server to put the proxy in front of: what it is, what it is called, who it is.

`Upstream` (`spec.py`) names one (a command, a URL, a desktop config entry); `identity.py` says
who it is (rule 22: name and launch digest), what that scopes, and how a loop of proxies is
found. No FastMCP here: the CLI reads and checks an upstream before it imports FastMCP, and
`mcp-once wrap` and a many-upstream proxy can name upstreams the same way. For the same reason
the stdio child's early start (`early.py`) and the replay of the proxy's previous first answers
(`replay.py`) live here: both run before FastMCP is imported.
"""

from .identity import LoopError, UpstreamIdentity, check_chain, loop_message
from .spec import Upstream, UpstreamConfigError, check_names

__all__ = [
    "LoopError",
    "Upstream",
    "UpstreamConfigError",
    "UpstreamIdentity",
    "check_chain",
    "check_names",
    "loop_message",
]
