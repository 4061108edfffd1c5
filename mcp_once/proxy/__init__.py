"""`mcp-once proxy` as a Python API: the guard in front of an MCP server you did not write.

`build_proxy(upstream, store, policy=..., **options)` returns a FastMCP server that forwards to one
`Upstream` (a stdio command, a streamable HTTP URL, or an entry of a desktop client's
`mcpServers` config) and runs each of its tools under `IdempotencyMiddleware`, as the
`ProxyPolicy` (`load_policy(path)`, TOML) says; `build_gateway(upstreams, store, ...)` serves
several upstreams on one front, each through a proxy of its own, its tools named
`<upstream>_<tool>`. Its HTTP front takes any FastMCP `AuthProvider` (`auth=`;
`token_file_auth(path)` and `jwt_auth(...)` make the CLI's two) and bounds request bodies and each
principal's calls in flight (`max_body=`, `max_in_flight=`). Needs the `fastmcp` extra
(`pip install 'mcp-once[fastmcp]'`); importing this package without it raises an ImportError that
says so.

The proxy lives in the application layer: it uses both libraries (the guard from `idempotency`,
the never-sent / maybe-executed classification and reconnection from `orchestrator`), and neither
library knows it.
"""

try:
    import fastmcp  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is a dev dependency here
    raise ImportError(
        "mcp-once proxy needs FastMCP: install the extra, pip install 'mcp-once[fastmcp]'"
    ) from exc

from mcp_once._upstream import Upstream, UpstreamConfigError

from .auth import AuthConfigError, jwt_auth, read_token_file, token_file_auth
from .failures import UpstreamUnreachable
from .gateway import OnceGateway, build_gateway
from .policy import PolicyError, ProxyPolicy, ToolPolicy, load_policy, parse_policy
from .server import OnceProxy, build_proxy
from .upstream import UpstreamLink, UpstreamStartFailed

__all__ = [
    "AuthConfigError",
    "OnceGateway",
    "OnceProxy",
    "PolicyError",
    "ProxyPolicy",
    "ToolPolicy",
    "Upstream",
    "UpstreamConfigError",
    "UpstreamLink",
    "UpstreamStartFailed",
    "UpstreamUnreachable",
    "build_gateway",
    "build_proxy",
    "jwt_auth",
    "load_policy",
    "parse_policy",
    "read_token_file",
    "token_file_auth",
]
