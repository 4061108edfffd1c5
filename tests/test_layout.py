"""The house rule, read from the source: two libraries that do not know each other, and the
application above them.

- `idempotency` (the server library) imports nothing from `orchestrator` or `mcp_once`;
- `orchestrator` (the client library) imports from `idempotency` only the wire contract,
  `idempotency.wire`, and nothing from `mcp_once`;
- `mcp_once` (the command, the demo, the scenario engine) may import both; neither imports it.

The import graph is read with `ast`, not by importing, so every import statement counts: those
inside functions and `if TYPE_CHECKING:` blocks too, with relative imports resolved. The checker
is run on small synthetic trees as well, to show that it fails when a forbidden import appears.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("idempotency", "orchestrator", "mcp_once")

#: Per library: the packages it must not import, each with the modules that are let through.
RULES: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "idempotency": {"orchestrator": (), "mcp_once": ()},
    "orchestrator": {"idempotency": ("idempotency.wire",), "mcp_once": ()},
}


@dataclass(frozen=True)
class Import:
    """One imported name, absolute: `from x import y` is `x.y`, whether `y` is a module or not."""

    path: Path
    line: int
    target: str


def imports_in(root: Path, path: Path) -> Iterator[Import]:
    """Every import in the file at `path` (inside `root`), relative ones resolved."""
    relative = path.relative_to(root)
    package = list(relative.parent.parts)
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(relative, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            prefix = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                yield Import(relative, node.lineno, f"{prefix}.{alias.name}")


def _let_through(target: str, allowed: tuple[str, ...]) -> bool:
    return any(target == name or target.startswith(name + ".") for name in allowed)


def violations(root: Path) -> list[str]:
    """Each import under `root` that breaks `RULES`, as `path:line: package imports target`."""
    found = []
    for package, forbidden in RULES.items():
        for path in sorted((root / package).rglob("*.py")):
            for imp in imports_in(root, path):
                top = imp.target.split(".")[0]
                if top in forbidden and not _let_through(imp.target, forbidden[top]):
                    found.append(f"{imp.path}:{imp.line}: {package} imports {imp.target}")
    return found


def test_the_libraries_do_not_know_each_other() -> None:
    assert violations(ROOT) == []


def test_the_checker_reads_the_real_packages() -> None:
    """Guards against a vacuous pass: every package has files, and the one allowed arrow from
    the client to the server library is seen."""
    for package in PACKAGES:
        assert list((ROOT / package).rglob("*.py")), package
    client_imports = {
        imp.target
        for path in (ROOT / "orchestrator").rglob("*.py")
        for imp in imports_in(ROOT, path)
    }
    assert "idempotency.wire" in client_imports


FORBIDDEN = [
    ("idempotency/_x.py", "import orchestrator\n", "1: idempotency imports orchestrator"),
    (
        "idempotency/_x.py",
        "import os\nfrom orchestrator.chaos import Chaos\n",
        "2: idempotency imports orchestrator.chaos.Chaos",
    ),
    (
        "idempotency/sub/__init__.py",
        "def f():\n    from mcp_once import scenarios\n",
        "2: idempotency imports mcp_once.scenarios",
    ),
    (
        "orchestrator/_x.py",
        "import typing\nif typing.TYPE_CHECKING:\n    from idempotency import KeyStore\n",
        "3: orchestrator imports idempotency.KeyStore",
    ),
    ("orchestrator/_x.py", "import idempotency\n", "1: orchestrator imports idempotency"),
    (
        "orchestrator/_x.py",
        "from idempotency._store import KeyStore\n",
        "1: orchestrator imports idempotency._store.KeyStore",
    ),
    (
        "orchestrator/_x.py",
        "import idempotency.wire_v2\n",
        "1: orchestrator imports idempotency.wire_v2",
    ),
    (
        "orchestrator/chaos/_x.py",
        "from mcp_once.scenarios import check\n",
        "1: orchestrator imports mcp_once.scenarios.check",
    ),
]


@pytest.mark.parametrize(("path", "source", "reported"), FORBIDDEN)
def test_a_forbidden_import_is_reported(
    tmp_path: Path, path: str, source: str, reported: str
) -> None:
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text(source)
    assert violations(tmp_path) == [f"{path}:{reported}"]


ALLOWED = [
    ("orchestrator/_x.py", "from idempotency import wire\n"),
    ("orchestrator/_x.py", "from idempotency.wire import KEY_META\n"),
    ("orchestrator/_x.py", "import idempotency.wire\n"),
    ("orchestrator/chaos/_x.py", "from .. import _gate\nfrom ._plan import Fault\n"),
    ("idempotency/_x.py", "from . import wire\nfrom ._store import KeyStore\n"),
    ("mcp_once/_x.py", "import orchestrator\nfrom idempotency import KeyStore\n"),
]


@pytest.mark.parametrize(("path", "source"), ALLOWED)
def test_an_allowed_import_is_not_reported(tmp_path: Path, path: str, source: str) -> None:
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text(source)
    assert violations(tmp_path) == []


def test_relative_imports_are_resolved(tmp_path: Path) -> None:
    source = "from .. import _gate\nfrom ._plan import Fault\nfrom . import _record\n"
    for path in ("orchestrator/chaos/_x.py", "orchestrator/chaos/__init__.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(source)
        targets = {imp.target for imp in imports_in(tmp_path, tmp_path / path)}
        assert targets == {
            "orchestrator._gate",
            "orchestrator.chaos._plan.Fault",
            "orchestrator.chaos._record",
        }
