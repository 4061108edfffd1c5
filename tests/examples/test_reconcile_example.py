"""`examples/reconcile.py` runs as docs/reconcile.md says: the server dies right after the
provider charged, is restarted on the same key store, and the retry gets the provider's charge,
marked reconciled; the provider (its own process, its own book) holds one charge."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_reconcile_example_gets_the_charge_from_the_provider(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "reconcile.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "server 1 charged the card, then died before storing the result",
        "the retry got {'charge': 'ch_1', 'order': 'A-1', 'amount': 500} (replayed,"
        " reconciled: True)",
        "the provider holds 1 charge(s) for order A-1",
    ]
    assert "Traceback" not in done.stderr
