"""The library is silent unless asked: in a program that configured no logging, a warning of
ours must not reach stderr through Python's last-resort handler (the standard library's
convention for libraries: a `NullHandler` on each top logger)."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import logging
import idempotency, orchestrator
for name in ("idempotency", "idempotency._stores.redis.store", "orchestrator", "orchestrator.run"):
    logging.getLogger(name).warning("a warning of %s", name)
"""


def test_no_warning_reaches_stderr_without_logging_configured() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stderr == ""


def test_a_program_that_configures_logging_sees_them() -> None:
    program = "import logging; logging.basicConfig()" + PROGRAM
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    assert "a warning of orchestrator.run" in done.stderr
    assert "a warning of idempotency._stores.redis.store" in done.stderr
