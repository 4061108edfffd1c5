"""Fixtures for the server-side tests: one `store` per test, over every backend that exists."""

from __future__ import annotations

from server_kit import store

__all__ = ["store"]
