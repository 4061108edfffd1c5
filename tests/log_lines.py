"""Log lines as a comparison needs them: name, level, message and formatted traceback, caught
at the named loggers (FastMCP's do not propagate to the root, so caplog would miss them)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

Line = tuple[str, int, str, str]


class Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[Line] = []

    def emit(self, record: logging.LogRecord) -> None:
        trace = logging.Formatter().formatException(record.exc_info) if record.exc_info else ""
        self.lines.append((record.name, record.levelno, record.getMessage(), trace))

    def of(self, prefix: str) -> list[Line]:
        return [line for line in self.lines if line[0].startswith(prefix)]


@contextmanager
def logged(*names: str) -> Iterator[Logged]:
    """Every line the loggers `names` (and their children) emit inside the block, at DEBUG."""
    handler = Logged()
    loggers = [logging.getLogger(name) for name in names]
    levels = [one.level for one in loggers]
    for one in loggers:
        one.addHandler(handler)
        one.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        for one, level in zip(loggers, levels, strict=True):
            one.removeHandler(handler)
            one.setLevel(level)
