"""examples/openai_agents_temporal.py runs as a user runs it (a subprocess, against a Temporal
server), and its one charge is one record in the server's key store, executed once, under a key
from `temporal_tool_meta` (the crash test shows what that key buys after a crash)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from idempotency import RecordState, SQLiteKeyStore

ROOT = Path(__file__).resolve().parents[4]
EXAMPLE = ROOT / "examples" / "openai_agents_temporal.py"


def test_the_example_charges_once(temporal: str, tmp_path: Path) -> None:
    db = tmp_path / "keys.sqlite3"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--temporal", temporal, "--store", f"sqlite:///{db}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"charged: .+", done.stdout.strip()), done.stdout

    async def records() -> list[int]:
        store = SQLiteKeyStore(db)
        try:
            found = await store.list_records(state=RecordState.COMPLETED)
        finally:
            await store.aclose()
        return [record.attempts for record in found]

    assert anyio.run(records) == [1]


pytest.importorskip("temporalio")
