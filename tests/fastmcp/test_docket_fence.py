"""How the task-body fence gets into `fastmcp_tasks` (`_integrations/fastmcp/docket.py`): the
import hook patches `fastmcp_tasks.components` as it is imported, whichever finder supplies it,
and an import it cannot hook fails instead of leaving every task body unfenced. Real imports of
a stand-in `fastmcp_tasks` package written to a temporary folder (the real one is not installable
in this environment; `tests/envs/fastmcp-suite/tasks_check.py` runs the real one)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from idempotency._integrations.fastmcp.docket import _PATCHED, _patch, _PatchOnImport, install

COMPONENTS = "fastmcp_tasks.components"


async def run_body(*args: Any) -> Any:
    raise AssertionError("no body runs here")


def guarded(server: Any) -> bool:
    return True


def hook() -> _PatchOnImport:
    return _PatchOnImport(lambda module: _patch(module, run_body, guarded))


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A stand-in `fastmcp_tasks` with a `components.reentrant_task_fn`, first on the path, and
    `sys.meta_path` as the test leaves it restored."""
    root = tmp_path / "fastmcp_tasks"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "components.py").write_text("def reentrant_task_fn(fn, tool_name):\n    return fn\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path])
    saved = {
        name: sys.modules.pop(name) for name in ("fastmcp_tasks", COMPONENTS) if name in sys.modules
    }
    try:
        yield root
    finally:
        for name in ("fastmcp_tasks", COMPONENTS):
            sys.modules.pop(name, None)
        sys.modules.update(saved)


class LegacyLoader:
    """A loader of the old protocol only (`load_module`, no `exec_module`)."""

    def load_module(self, name: str) -> ModuleType:
        module = sys.modules[name] = ModuleType(name)
        return module


class LegacyFinder:
    """A finder that supplies `fastmcp_tasks.components` through a `LegacyLoader`."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        legacy = LegacyLoader()  # of the old protocol: not an importlib.abc.Loader
        return ModuleSpec(name, legacy) if name == COMPONENTS else None  # type: ignore[arg-type]


def test_the_hook_patches_components_as_they_are_imported(package: Path) -> None:
    sys.meta_path.insert(0, finder := hook())
    components = importlib.import_module(COMPONENTS)
    assert getattr(components.reentrant_task_fn, _PATCHED, False)
    assert finder not in sys.meta_path  # once: it leaves


def test_a_loader_without_exec_module_fails_the_import(package: Path) -> None:
    """Before: the hook returned the spec as it was and the module loaded unpatched, silently."""
    sys.meta_path[:0] = [finder := hook(), LegacyFinder()]
    with pytest.raises(RuntimeError, match="LegacyLoader, which has no exec_module"):
        importlib.import_module(COMPONENTS)
    assert finder not in sys.meta_path
    assert COMPONENTS not in sys.modules


def test_install_patches_at_once_when_fastmcp_tasks_is_imported(package: Path) -> None:
    importlib.import_module("fastmcp_tasks")  # its components not yet
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PatchOnImport)]
    install(run_body, guarded)
    assert not any(isinstance(f, _PatchOnImport) for f in sys.meta_path)
    assert getattr(sys.modules[COMPONENTS].reentrant_task_fn, _PATCHED, False)
