"""The DBOS examples run as a user runs them: `--crash` (the process dies after the charge, before
DBOS records the step), then again (DBOS.launch() recovers the workflow): one charge, replayed.

The count is read from outside, in the server's key store: one record, executed once. (The
example server's receipts live in its process's memory, so they cannot tell a second charge.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from idempotency import RecordState, SQLiteKeyStore

try:
    import dbos  # noqa: F401
except ImportError as missing:  # pragma: no cover - the `dbos` group is a default group
    message = f"DBOS NOT INSTALLED — the DBOS examples cannot run: {missing}"
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(message + " (under CI a missing engine is a failure)", pytrace=False)
    warnings.warn(message, stacklevel=1)
    pytest.skip(message, allow_module_level=True)

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SOON = 60.0
RECEIPT = r"(\{'charge_id': 'ch_\d+', 'order_id': 'order-1', 'cents': \d+\})"

#: Per example: what the crashing run prints, and what the recovering run prints.
RUNS = {
    "dbos_step.py": (
        re.compile(rf"charge: executed {RECEIPT}"),
        [
            re.compile(rf"charge: replayed {RECEIPT}"),
            re.compile(rf"workflow checkout-order-1: {RECEIPT}"),
        ],
    ),
    "pydantic_ai_dbos.py": (
        re.compile(rf"charged, then the process dies: {RECEIPT}"),
        [re.compile(rf"charged: {RECEIPT}")],
    ),
}


def run(example: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(EXAMPLES / example), "--store", f"sqlite:///{tmp / 'keys.sqlite3'}"]
    return subprocess.run(
        [*argv, *extra], cwd=tmp, capture_output=True, text=True, timeout=SOON, check=False
    )


@pytest.mark.parametrize("example", sorted(RUNS))
async def test_the_dbos_example_charges_once_across_a_crash(example: str, tmp_path: Path) -> None:
    crashing, recovering = RUNS[example]
    first = run(example, tmp_path, "--crash")
    assert first.returncode == 3, first.stderr
    (line,) = first.stdout.splitlines()
    charged = crashing.fullmatch(line)
    assert charged, first.stdout
    second = run(example, tmp_path)
    assert second.returncode == 0, second.stderr
    assert "Traceback" not in second.stderr
    lines = second.stdout.splitlines()
    assert len(lines) == len(recovering), lines
    for pattern, printed in zip(recovering, lines, strict=True):
        match = pattern.fullmatch(printed)
        assert match, lines
        assert match.group(1) == charged.group(1)  # the first run's receipt, replayed
    store = SQLiteKeyStore(tmp_path / "keys.sqlite3")
    try:
        records = await store.list_records(state=RecordState.COMPLETED)
    finally:
        await store.aclose()
    assert [record.attempts for record in records] == [1]
