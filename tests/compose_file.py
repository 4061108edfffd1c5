"""docker-compose.yml as the tests read it: a service's `command:` list, without a YAML library
(none is a dependency of the project), and the whole file through PyYAML where it happens to be
installed, for the checks that need more than a command.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"


def compose_command(service: str) -> list[str]:
    """The `command:` list of one service, read without a YAML library.

    The file keeps commands as block lists of scalars, which this reads exactly.
    """
    text = COMPOSE_FILE.read_text()
    found = re.search(
        rf"^  {re.escape(service)}:\n(?:    .*\n|\n)*?    command:(?: &\S+)?\n((?:      - .*\n)+)",
        text,
        re.MULTILINE,
    )
    assert found, f"no block-list command for service {service!r}"
    items = [line.strip()[2:].strip() for line in found.group(1).splitlines()]
    return [item[1:-1] if item[:1] in "\"'" else item for item in items]


def compose_services() -> dict[str, Any] | None:
    """Every service as PyYAML parses the file; None where PyYAML is not installed."""
    try:
        import yaml
    except ImportError:
        return None
    services: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    return services
