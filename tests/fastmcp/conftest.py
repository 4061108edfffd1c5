"""FastMCP tests: the server tests' helpers (`tests/server/server_kit.py`) and its `store`
fixture, one key store of each kind per test."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "server"))

from server_kit import store

__all__ = ["store"]
