"""The chaos scenario engine, for the FastMCP chaos case: imported here and only here, so that
its move to another package changes one line."""

from __future__ import annotations

from mcp_once.scenarios import (
    HttpEndpoint,
    Ledger,
    Report,
    ServerProcess,
    ShopEffects,
    check,
    default_plan,
    default_policy,
    marks,
    run_workload,
)

__all__ = [
    "HttpEndpoint",
    "Ledger",
    "Report",
    "ServerProcess",
    "ShopEffects",
    "check",
    "default_plan",
    "default_policy",
    "marks",
    "run_workload",
]
