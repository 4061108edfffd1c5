"""What an upstream is: a stdio command (with its env and folder) or a streamable HTTP URL (with
its headers), what it is called, and who it is (`identity.py`).

Kept apart from the proxy's FastMCP parts (`mcp_once.proxy`, which imports FastMCP): naming an
upstream, reading a desktop config entry and finding a loop need none of it, so `mcp-once proxy`
stops a loop, and the CLI reads a config, before FastMCP is imported.
`mcp_once.proxy` re-exports `Upstream` and `UpstreamConfigError`.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from .identity import (
    UpstreamIdentity,
    check_name,
    hashed,
    launch_digest,
    slug,
)


class UpstreamConfigError(ValueError):
    """The upstream cannot be named as given (no such server in the config file, no command)."""


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where the upstream is: a stdio command, or a streamable HTTP URL; and what it is called
    (`label`: `--name`, or the config entry's name; else `name` derives one). Its identity
    (`identity.py`) scopes the proxy's records."""

    command: tuple[str, ...] = ()
    url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    label: str | None = None

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise UpstreamConfigError("an upstream is either a command or a URL, exactly one")
        if self.label is not None:
            try:
                check_name(self.label)
            except ValueError as exc:
                raise UpstreamConfigError(str(exc)) from None

    @classmethod
    def stdio(
        cls, *command: str, env: Mapping[str, str] | None = None, name: str | None = None
    ) -> Upstream:
        return cls(command=tuple(command), env=dict(env or {}), label=name)

    @classmethod
    def http(
        cls, url: str, headers: Mapping[str, str] | None = None, name: str | None = None
    ) -> Upstream:
        return cls(url=url, headers=dict(headers or {}), label=name)

    @classmethod
    def from_config(cls, path: str | Path, server: str) -> Upstream:
        """The `mcpServers` entry `server` of a desktop client's JSON config file, named
        `server`."""
        servers = _config_servers(path)
        if server not in servers:
            names = ", ".join(sorted(servers)) or "none"
            raise UpstreamConfigError(f"no server {server!r} in {path} (mcpServers: {names})")
        return cls.from_entry(servers[server], server, f"mcpServers.{server} in {path}")

    @classmethod
    def from_entry(cls, entry: object, name: str, where: str | None = None) -> Upstream:
        """A client config's server entry (`command`, `args`, `env`, `cwd`; or `url`, Windsurf's
        `serverUrl`, and `headers`), named `name`; `where` says where it is in errors."""
        where = where or name
        if not isinstance(entry, dict):
            raise UpstreamConfigError(f"{where} must be an object")
        url = entry.get("url", entry.get("serverUrl"))
        if isinstance(url, str):
            return cls.http(url, entry.get("headers") or {}, name=name)
        command = entry.get("command")
        if not isinstance(command, str):
            raise UpstreamConfigError(f"{where} has no command or url")
        args = [str(a) for a in entry.get("args") or []]
        env = {str(k): str(v) for k, v in (entry.get("env") or {}).items()}
        return cls(command=(command, *args), env=env, cwd=entry.get("cwd"), label=name)

    @staticmethod
    def config_names(path: str | Path) -> list[str]:
        """The names of the `mcpServers` entries of a desktop client's JSON config file, in the
        file's order."""
        return list(_config_servers(path))

    @property
    def name(self) -> str:
        """What the upstream is called: its `label`, else a word of its command, or its URL's
        host and path (never its credentials or query, which may hold a secret)."""
        if self.label is not None:
            return self.label
        if self.url is not None:
            parts = urlsplit(self.url)
            return slug(f"{parts.hostname or ''}{parts.path}")
        # Skip runners and flags (`npx -y @scope/server-memory` names `server-memory`).
        picked = [
            w for w in self.command if not w.startswith("-") and Path(w).name not in _RUNNERS
        ] or list(self.command)
        return slug(picked[0].rstrip("/").rsplit("/", 1)[-1])

    @property
    def folder(self) -> str | None:
        """The folder a stdio child runs in: the entry's `cwd` (relative to ours), else ours,
        resolved (None for a URL)."""
        if self.url is not None:
            return None
        return os.path.realpath(os.path.join(os.getcwd(), self.cwd or "."))

    @property
    def identity(self) -> UpstreamIdentity:
        """Its name and launch digest: what scopes the proxy's records (`identity.py`)."""
        if self.url is not None:
            launch = launch_digest({"url": self.url, "headers": _hashed(self.headers, lower=True)})
        else:
            launch = launch_digest(
                {"command": list(self.command), "cwd": self.folder, "env": _hashed(self.env)}
            )
        return UpstreamIdentity(self.name, launch)

    def described(self) -> str:
        """The upstream for a person to read: its command line (and the names of the env
        variables it is given, never their values), or its URL without credentials or query (and
        the names of its headers)."""
        if self.url is not None:
            parts = urlsplit(self.url)
            shown = parts._replace(netloc=parts.netloc.rpartition("@")[2], query="", fragment="")
            query = "?..." if parts.query else ""
            headers = f" (headers: {', '.join(sorted(self.headers))})" if self.headers else ""
            return urlunsplit(shown) + query + headers
        env = f" (env: {', '.join(sorted(self.env))})" if self.env else ""
        cwd = f" (in {self.cwd})" if self.cwd else ""
        return shlex.join(self.command) + env + cwd


def check_names(upstreams: Sequence[Upstream]) -> None:
    """`UpstreamConfigError` when two upstreams would share a name on the front: the same name,
    or one name and `_` starting another's (`git` and `git_work`: `git_work_log` could be either
    upstream's tool)."""
    names = [u.name for u in upstreams]
    for index, name in enumerate(names):
        for other in names[index + 1 :]:
            if name == other:
                raise UpstreamConfigError(
                    f"two upstreams are named {name!r}: on one front each needs a name of its own"
                )
            first, second = sorted((name, other), key=len)
            if second.startswith(f"{first}_"):
                raise UpstreamConfigError(
                    f"the upstreams {first!r} and {second!r} cannot share a front: their tools are"
                    f" named {first}_<tool> and {second}_<tool>, so {second}_x could be either's;"
                    " rename one entry, or serve them from two proxies"
                )


def _config_servers(path: str | Path) -> dict[str, object]:
    """The `mcpServers` object of a desktop client's JSON config file ({} when it has none)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UpstreamConfigError(f"cannot read the config file {path}: {exc}") from exc
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    return servers if isinstance(servers, dict) else {}


def _hashed(values: Mapping[str, str], *, lower: bool = False) -> dict[str, str]:
    """Each value as its SHA-256 (an env value or a header may be a secret)."""
    return {(k.lower() if lower else k): hashed(v) for k, v in values.items()}


#: Launchers whose first non-flag argument names the server.
_RUNNERS = frozenset({"npx", "uvx", "node", "python", "python3", "bunx", "deno", "pnpm", "dlx"})
