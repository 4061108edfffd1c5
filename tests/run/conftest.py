"""Run tests: the durable crash kit (`tests/durable`) and the client tests' servers importable."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
for folder in (HERE, HERE.parent / "durable", HERE.parent / "client"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
