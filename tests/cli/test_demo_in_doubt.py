"""`mcp-once demo`'s in-doubt payment (rule 19): a server SIGKILLed right after it paid, restarted
on the same store, the payment retried. Without reconcile= the record is left UNKNOWN and the
retry gets -32012; with it the retry gets the payment; the ledger holds one payment either way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(sys.executable).with_name("mcp-once")


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), "demo", "--calls", "5", "--pipelines", "0", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_demo_kills_a_server_after_it_paid_without_and_with_reconcile() -> None:
    ran = demo("--json")
    assert ran.returncode == 0, ran.stderr[-2000:]
    found = json.loads(ran.stdout)["in_doubt"]
    assert found["ok"] is True
    plain, reconciled = found["without_reconcile"], found["with_reconcile"]
    assert (plain["effects"], plain["duplicates"], plain["unknown_left"], plain["answer"]) == (
        1,
        0,
        1,
        "-32012",
    )
    assert (
        reconciled["effects"],
        reconciled["duplicates"],
        reconciled["unknown_left"],
        reconciled["answer"],
    ) == (1, 0, 0, "reconciled")


def test_the_demo_says_it_in_words_and_can_skip_it() -> None:
    ran = demo()
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "Then the in-doubt payment" in ran.stdout
    assert "UNKNOWN records left" in ran.stdout
    assert "With it: the retry got the payment from the system of record" in ran.stdout
    skipped = demo("--no-in-doubt", "--json")
    assert skipped.returncode == 0 and json.loads(skipped.stdout)["in_doubt"] is None
