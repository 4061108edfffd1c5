"""A real `redis-server` on a free loopback port, for tests, chaos runs and benchmarks.

The tests never mock Redis: atomicity and Lua are the point. This module starts, restarts, pauses
and stops a private server; each instance owns its own data directory and port.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
from redis_tls import TLSFiles

from mcp_once.scenarios._process import ChildProcess, free_port


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


class RedisServer(ChildProcess):
    """One private redis-server process. `appendonly=True` makes restarts keep acknowledged
    writes (fsync always), which the chaos suite relies on. With `tls`, it listens on `port`
    over TLS only (client certificates required, replication over TLS too)."""

    def __init__(
        self,
        *,
        appendonly: bool = False,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        tls: TLSFiles | None = None,
    ) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise FileNotFoundError("redis-server is not on PATH")
        self.binary = binary
        self.port = port or free_port()
        self.appendonly = appendonly
        #: More `--option value` words (replication, cluster mode, ...), appended last.
        self.extra_args = list(extra_args)
        self.tls = tls
        self.dir = Path(tempfile.mkdtemp(prefix="mcp-once-redis-"))
        super().__init__()

    @property
    def url(self) -> str:
        if self.tls is not None:
            return f"rediss://127.0.0.1:{self.port}/0?{self.tls.query()}"
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **options: Any) -> redis.Redis:
        """A synchronous redis-py client of this server (over TLS if it speaks TLS)."""
        if self.tls is not None:
            options.update(
                ssl=True,
                ssl_ca_certs=str(self.tls.ca),
                ssl_certfile=str(self.tls.cert),
                ssl_keyfile=str(self.tls.key),
            )
        return redis.Redis(host="127.0.0.1", port=self.port, **options)

    def command(self) -> list[str]:
        """The command line that starts this server (a Sentinel overrides it)."""
        listen = ["--port", str(self.port)]
        if self.tls is not None:
            listen = ["--port", "0", "--tls-port", str(self.port), *self.tls.server_args()]
        args = [
            self.binary,
            *listen,
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--loglevel",
            "warning",
        ]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        return args + self.extra_args

    def start(self, timeout: float = 10.0) -> None:
        args = self.command()
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            if self._answers():
                return
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"redis-server on port {self.port} did not answer in {timeout}s")

    def _answers(self) -> bool:
        if self.tls is not None:
            try:
                with self.client(socket_timeout=0.5) as client:
                    return bool(client.ping())
            except (redis.RedisError, OSError):
                return False
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
