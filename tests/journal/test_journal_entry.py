"""`Entry` and `fingerprint_arguments`: a malformed entry never reaches a journal, and "the same
arguments" means the same thing in every process."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from journal_kinds import entry

from orchestrator._journal import Entry, fingerprint_arguments


def test_the_fingerprint_ignores_key_order_and_whitespace() -> None:
    assert fingerprint_arguments({"a": 1, "b": [1, 2]}) == fingerprint_arguments(
        json.loads('{ "b" : [1,2], "a":1 }')
    )
    assert fingerprint_arguments(None) == fingerprint_arguments({})
    assert fingerprint_arguments({"a": 1}) != fingerprint_arguments({"a": 2})
    assert fingerprint_arguments({"a": "é"}) != fingerprint_arguments({"a": "e"})


def test_the_fingerprint_is_short_hex() -> None:
    digest = fingerprint_arguments({"to": "x@example.com"})
    assert len(digest) == 32 and int(digest, 16) >= 0


def test_the_fingerprint_is_the_same_in_another_process() -> None:
    arguments = {"z": [1.5, None, True], "a": {"nested": "ü"}}
    code = (
        "import json,sys; from orchestrator._journal import fingerprint_arguments;"
        " print(fingerprint_arguments(json.loads(sys.argv[1])))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code, json.dumps(arguments)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    )
    assert other.stdout.strip() == fingerprint_arguments(arguments)


@pytest.mark.parametrize("bad", [{"x": float("nan")}, {"x": object()}, {"x": {1, 2}}])
def test_arguments_that_are_not_plain_json_are_refused(bad: dict[Any, Any]) -> None:
    with pytest.raises(ValueError, match="not plain JSON"):
        fingerprint_arguments(bad)


GOOD = entry(0).__dict__


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("position", -1, ValueError),
        ("position", True, TypeError),
        ("position", "0", TypeError),
        ("server", "", ValueError),
        ("tool", None, ValueError),
        ("fingerprint", "", ValueError),
        ("key", "", ValueError),
        ("key", "k" * 300, ValueError),
        ("state", "sent", ValueError),
        ("at", float("inf"), ValueError),
        ("at", "now", ValueError),
    ],
)
def test_a_malformed_entry_is_refused(field: str, value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        Entry(**{**GOOD, field: value})


def test_same_call_ignores_state_and_time() -> None:
    first = entry(3)
    assert first.same_call(Entry(**{**first.__dict__, "state": "done", "at": 1.0}))
    assert not first.same_call(entry(4))
