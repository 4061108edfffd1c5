"""A child process the chaos suite can strike: kill -9, a polite stop, SIGSTOP and SIGCONT.

Shared by the workload's MCP servers and the test suite's private redis-server, so that "how a
process is killed or frozen" is written once.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess


def free_port() -> int:
    """A loopback port nobody listens on right now (the usual bind-to-0 probe)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class ChildProcess:
    """Holds one `subprocess.Popen`; subclasses say how to start it."""

    #: Seconds a polite stop (SIGTERM) may take before it becomes a kill.
    stop_timeout = 10.0

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def _gone(self) -> None:
        """Called whenever the process is being taken down; subclasses clear their readiness."""

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to finish anything (a crash)."""
        self._gone()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after `stop_timeout`. A paused process is resumed first, or it
        could not act on the SIGTERM."""
        self._gone()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)
