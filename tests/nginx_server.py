"""A real nginx (Debian's package) on a free loopback port, round-robin over given upstreams.

The load-balancer tests never stand a Python router in for nginx: its passive health checks and
its rule about resending POSTs are what is under test. Each instance owns a temporary prefix
(config, pid file, logs, temp paths) and runs in the foreground (`-g "daemon off;"`, as in the
official image), started with `-p <dir> -e <dir>/error.log` so it needs no root and no file
outside its directory.

The location block is `deploy/mcp-proxy.conf`, the one the docker-compose profile deploys. The
access log, one JSON object a request, names the replica that answered (`$upstream_addr`) and
keeps the request body: how a test tells which replica each attempt of a call reached.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mcp_once.scenarios import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
#: The proxying shared with the deployment: the location block, included as it is.
PROXY_CONF = ROOT / "deploy" / "mcp-proxy.conf"
#: The deployment's config, for syntax checks.
DEPLOY_CONF = ROOT / "deploy" / "nginx.conf"

_CONFIG = """\
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;

events {{
    worker_connections 1024;
}}

http {{
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    log_format mcp escape=json '{{"status":"$status","upstream":"$upstream_addr",'
        '"version":"$http_mcp_protocol_version","session":"$http_mcp_session_id",'
        '"body":"$request_body"}}';
    access_log {dir}/access.log mcp;

    upstream mcp_replicas {{
{servers}
    }}

    server {{
        listen 127.0.0.1:{port};
        include {proxy};
    }}
}}
"""


def nginx_binary() -> str | None:
    """nginx on PATH, or where Debian puts it (/usr/sbin is not on every user's PATH)."""
    found = shutil.which("nginx")
    if found is None and os.access("/usr/sbin/nginx", os.X_OK):
        found = "/usr/sbin/nginx"
    return found


def check_config(binary: str, conf: Path) -> subprocess.CompletedProcess[str]:
    """`nginx -t` on `conf`, its directory as the prefix (nothing written elsewhere)."""
    prefix = ["-p", str(conf.parent), "-e", str(conf.parent / "error.log")]
    return subprocess.run(
        [binary, "-t", *prefix, "-c", str(conf)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@dataclass(frozen=True, slots=True)
class Proxied:
    """One request as nginx logged it."""

    status: int
    #: Every upstream nginx tried, in order ("host:port"); the last one answered.
    upstreams: tuple[str, ...]
    #: The MCP-Protocol-Version and Mcp-Session-Id headers the client sent ("" when absent).
    version: str
    session: str
    body: str

    def message(self) -> dict[str, object] | None:
        """The JSON-RPC message the body carried, if it was one."""
        try:
            message = json.loads(self.body)
        except ValueError:
            return None
        return message if isinstance(message, dict) else None


def deployed_config(upstreams: Sequence[str], port: int, prefix: Path) -> Path:
    """deploy/nginx.conf as it would run here, written into `prefix` next to the location block
    it includes: the compose service names replaced by `upstreams`, listening on
    127.0.0.1:`port`, its pid file in `prefix`. Nothing else changes."""
    text = DEPLOY_CONF.read_text()
    hosts = re.findall(r"^\s*server (\S+) ", text, re.MULTILINE)
    if len(hosts) != len(upstreams):
        raise ValueError(f"deploy/nginx.conf names {len(hosts)} replicas, not {len(upstreams)}")
    for host, upstream in zip(hosts, upstreams, strict=True):
        text = text.replace(f"server {host} ", f"server {upstream} ")
    for deployed, here in (
        ("listen 8080;", f"listen 127.0.0.1:{port};"),
        ("pid /tmp/nginx.pid;", f"pid {prefix}/nginx.pid;"),
    ):
        if deployed not in text:
            raise ValueError(f"deploy/nginx.conf no longer says {deployed!r}")
        text = text.replace(deployed, here)
    shutil.copy(PROXY_CONF, prefix / PROXY_CONF.name)
    conf = prefix / "nginx.conf"
    conf.write_text(text)
    return conf


class NginxServer(ServerProcess):
    """nginx in the foreground, balancing round-robin over `upstreams` ("host:port" each).

    By default with the test config (the deployed location block, and an access log of JSON
    lines that `requests()` reads); `deployed=True` runs deploy/nginx.conf itself instead (see
    `deployed_config`; its access log goes to nginx's stdout, not to `requests()`).
    """

    def __init__(
        self,
        binary: str,
        upstreams: Sequence[str],
        *,
        deployed: bool = False,
        location: Path = PROXY_CONF,
        max_fails: int = 1,
    ) -> None:
        if not upstreams:
            raise ValueError("nginx needs at least one upstream")
        self.binary = binary
        self.upstreams = list(upstreams)
        self.deployed = deployed
        #: The location block (test config only): the deployed one unless a test varies it.
        self.location = location
        #: Failures that take an upstream out of rotation for 10 s (0: never).
        self.max_fails = max_fails
        self.dir = Path(tempfile.mkdtemp(prefix="mcp-once-nginx-"))
        # Run as root, nginx's workers drop to an unprivileged user: they must reach the prefix.
        self.dir.chmod(0o755)
        super().__init__(self._command, log=self.dir / "stderr.log")

    def _command(self, port: int) -> list[str]:
        if self.deployed:
            conf = deployed_config(self.upstreams, port, self.dir)
        else:
            servers = "\n".join(
                f"        server {upstream} max_fails={self.max_fails} fail_timeout=10s;"
                for upstream in self.upstreams
            )
            conf = self.dir / "nginx.conf"
            conf.write_text(
                _CONFIG.format(dir=self.dir, servers=servers, port=port, proxy=self.location)
            )
        prefix = ["-p", str(self.dir), "-e", str(self.error_log)]
        return [self.binary, *prefix, "-c", str(conf), "-g", "daemon off;"]

    @property
    def error_log(self) -> Path:
        return self.dir / "error.log"

    def start(self) -> None:
        try:
            super().start()
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"nginx did not start: {exc}\n{self.errors()}") from exc

    def errors(self) -> str:
        """nginx's error log and its own output so far."""
        return "\n".join(
            path.read_text(errors="replace")
            for path in (self.error_log, self.dir / "stderr.log")
            if path.exists()
        )

    def requests(self) -> list[Proxied]:
        """Every request nginx has logged so far (a request is logged when it ends)."""
        log = self.dir / "access.log"
        if not log.exists():
            return []
        proxied = []
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            upstreams = tuple(u.strip() for u in entry["upstream"].split(",") if u.strip())
            proxied.append(
                Proxied(
                    status=int(entry["status"]),
                    upstreams=upstreams,
                    version=entry["version"],
                    session=entry["session"],
                    body=entry["body"],
                )
            )
        return proxied

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> NginxServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
