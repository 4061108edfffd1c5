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
import importlib
import re
import subprocess
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


# -- The house, second pass (#21): integrations plug in, no circles, the application uses only
# -- public names. Read from the same `ast` graph; each rule also shown to fail on a synthetic
# -- tree.

#: Third-party frameworks that only an integration module may import (each an optional extra).
FRAMEWORKS = ("fastmcp", "pydantic_ai", "agents", "dbos")


def modules_of(root: Path) -> dict[str, Path]:
    """Every module of the three packages under `root`, by dotted name (a package by its
    `__init__`)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def module_of(target: str, modules: Mapping[str, Path]) -> str | None:
    """The module an import target lands in (`pkg.mod.name` -> `pkg.mod`), if one of ours."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_framework_at_run_time(path: Path) -> bool:
    """Whether the file imports a framework outside `if TYPE_CHECKING:` (naming a framework's
    class in a type is not depending on it)."""
    pending: list[ast.AST] = [ast.parse(path.read_text(), filename=str(path))]
    while pending:
        node = pending.pop()
        if _type_checking(node):
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            names = []
        if any(name.split(".")[0] in FRAMEWORKS for name in names):
            return True
        pending.extend(ast.iter_child_nodes(node))
    return False


def integrations_of(modules: Mapping[str, Path], root: Path) -> set[str]:
    """The integration modules: those that import a framework (an optional extra) at run time."""
    return {name for name, path in modules.items() if imports_framework_at_run_time(path)}


def core_imports_of_integrations(root: Path) -> list[str]:
    """Imports of an integration module by a module that is not one (rule 2): adapters plug
    into the core, the core never names them."""
    modules = modules_of(root)
    integrations = integrations_of(modules, root)
    found = []
    for name, path in modules.items():
        if name in integrations or name.split(".")[0] == "mcp_once":
            continue
        for imp in imports_in(root, path):
            target = module_of(imp.target, modules)
            if target in integrations and target != name:
                found.append(f"{imp.path}:{imp.line}: {name} imports integration {target}")
    return found


def circles(root: Path) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a circle (rule 3)."""
    modules = modules_of(root)
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for imp in imports_in(root, path):
            target = module_of(imp.target, modules)
            if target is not None and target != name:
                edges[name].add(target)
    # Tarjan's strongly connected components, iteratively.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


def private_reaches(root: Path) -> list[str]:
    """Imports by the application (`mcp_once`) of a private module or name of a library
    (rule 4): whatever the CLI and the scenario engine need, a user's own tooling needs too."""
    found = []
    for path in sorted((root / "mcp_once").rglob("*.py")):
        for imp in imports_in(root, path):
            top, *rest = imp.target.split(".")
            if top in ("idempotency", "orchestrator") and any(p.startswith("_") for p in rest):
                found.append(f"{imp.path}:{imp.line}: mcp_once imports {imp.target}")
    return found


def test_the_core_never_imports_an_integration() -> None:
    assert core_imports_of_integrations(ROOT) == []


def test_there_are_no_import_circles() -> None:
    assert circles(ROOT) == []


def test_the_application_uses_only_public_names() -> None:
    assert private_reaches(ROOT) == []


def test_the_new_rules_read_the_real_packages() -> None:
    """Not vacuous: the integrations are found, and the graph has the arrows it should."""
    modules = modules_of(ROOT)
    integrations = integrations_of(modules, ROOT)
    assert {
        "orchestrator.fastmcp",
        "orchestrator.pydantic_ai",
        "orchestrator.dbos",
        "idempotency.fastmcp",
    } <= integrations
    # The application's one framework-based feature is the proxy (`mcp-once proxy` is a FastMCP
    # server), kept in its own package that nothing else in the application imports at run time
    # (the CLI imports it inside the command), so every other command works without the extra.
    assert {n for n in integrations if n.split(".")[0] == "mcp_once"} <= {
        n for n in modules if n.startswith("mcp_once.proxy")
    }
    mcp_once_imports = {
        imp.target for path in (ROOT / "mcp_once").rglob("*.py") for imp in imports_in(ROOT, path)
    }
    assert any(t.startswith("idempotency") for t in mcp_once_imports)
    assert any(t.startswith("orchestrator") for t in mcp_once_imports)


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for package in PACKAGES:
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").touch()
    for path, source in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(source)
    return tmp_path


def test_a_core_import_of_an_integration_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "orchestrator/fastmcp.py": "import fastmcp\nfrom ._session import S\n",
            "orchestrator/_session.py": "S = 1\n",
            "orchestrator/_sessions.py": "def f():\n    from .fastmcp import Adapter\n",
        },
    )
    assert core_imports_of_integrations(root) == [
        "orchestrator/_sessions.py:2: orchestrator._sessions imports integration"
        " orchestrator.fastmcp"
    ]
    # Naming the framework's class in a type is allowed; importing our adapter is not.
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fastmcp import Client\n"
    (root / "orchestrator/_sessions.py").write_text(typed + "from ._session import S\n")
    (root / "orchestrator/__init__.py").write_text("from ._sessions import tool_session\n")
    assert core_imports_of_integrations(root) == []


def test_an_import_circle_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "idempotency/_a.py": "from ._b import x\n",
            "idempotency/_b.py": "import typing\nif typing.TYPE_CHECKING:\n    from ._c import y\n",
            "idempotency/_c.py": "def f():\n    from idempotency._a import z\n",
            "orchestrator/chaos/_one.py": "from ._two import t\n",
            "orchestrator/chaos/_two.py": "from . import _one\n",
            "mcp_once/_free.py": "from idempotency import _a\n",
        },
    )
    assert circles(root) == [
        ["idempotency._a", "idempotency._b", "idempotency._c"],
        ["orchestrator.chaos._one", "orchestrator.chaos._two"],
    ]
    (root / "orchestrator/chaos/_two.py").write_text("t = 1\n")
    assert circles(root) == [["idempotency._a", "idempotency._b", "idempotency._c"]]


def test_a_private_reach_of_the_application_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "mcp_once/_cli.py": (
                "from idempotency import open_store\n"
                "from idempotency._scope import store_key\n"
                "import orchestrator.chaos\n"
                "from orchestrator.chaos._plan import Fault\n"
                "from orchestrator import _gate\n"
            ),
        },
    )
    assert private_reaches(root) == [
        "mcp_once/_cli.py:2: mcp_once imports idempotency._scope.store_key",
        "mcp_once/_cli.py:4: mcp_once imports orchestrator.chaos._plan.Fault",
        "mcp_once/_cli.py:5: mcp_once imports orchestrator._gate",
    ]


#: The Python code blocks of the README and the docs, and the names they import from the libraries.
README_IMPORT = re.compile(
    r"^\s*from ((?:idempotency|orchestrator)(?:\.\w+)*) import \(?([\w, \n]+?)\)?\s*$",
    re.MULTILINE,
)


def readme_names() -> list[tuple[str, str]]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    blocks = [
        block
        for page in pages
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL)
    ]
    names = []
    for block in blocks:
        for module, listed in README_IMPORT.findall(block):
            for name in listed.replace("\n", " ").split(","):
                if name.strip():
                    names.append((module, name.strip().split(" as ")[0]))
    return sorted(set(names))


def test_every_name_the_readme_imports_is_public_and_importable() -> None:
    names = readme_names()
    assert len(names) >= 10, names  # the README's snippets are read
    for module, name in names:
        assert not any(part.startswith("_") for part in [*module.split("."), name]), (module, name)
        imported = importlib.import_module(module)
        assert hasattr(imported, name), f"from {module} import {name}"


#: What a newcomer listing the repository sees: the product. Test environments and upstream
#: suites live with the tests (`tests/envs/`).
TOP_LEVEL = {
    ".ci",
    "benchmarks",
    "deploy",
    "docs",
    "examples",
    "idempotency",
    "integrations",
    "mcp_once",
    "orchestrator",
    "tests",
}


def test_the_top_level_shows_the_product() -> None:
    """Read from what git tracks (a clone's view), not from the folder, where caches, a built
    site or a local `.mcp-once/` store may lie."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    folders = {line.split("/", 1)[0] for line in tracked if "/" in line}
    assert folders == TOP_LEVEL
