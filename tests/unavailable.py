"""The one rule for a test that cannot find what it needs (a binary, a server, an npm package):
outside CI it skips with a loud reason (a warning, and the reason in `-rs`); under CI (CI=true)
it fails, so that a green CI means the part was tested."""

from __future__ import annotations

import os
import warnings
from typing import NoReturn

import pytest

UNDER_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def unavailable(message: str, what: str) -> NoReturn:
    """Skip loudly with `message`, or under CI fail, saying that a missing `what` fails there."""
    if UNDER_CI:
        pytest.fail(f"{message} (under CI a missing {what} is a failure)", pytrace=False)
    warnings.warn(message, stacklevel=3)
    pytest.skip(message)
