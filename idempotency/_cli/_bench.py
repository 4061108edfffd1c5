"""placeholder"""

from __future__ import annotations

from typing import Any


def add_parser(commands: Any) -> None:
    return None
