"""Give every FastMCP server built in this interpreter mcp-once's middleware, as a user would.

`install()` wraps `fastmcp.server.server.FastMCP.__init__` (the class `fastmcp.FastMCP` names)
so that, once the original constructor has returned, the server gets

    server.add_middleware(IdempotencyMiddleware(MemoryKeyStore()))

exactly what mcp-once's README tells a FastMCP user to write right after `FastMCP(...)`: it is
the first middleware added with `add_middleware`, after any passed as `FastMCP(middleware=...)`
and after the `DereferenceRefsMiddleware` that the constructor appends itself. Subclasses
(`FastMCPProxy`, ...) get it through their `super().__init__()`.

If `fastmcp.server.server` is not imported yet, `install()` waits for it with a meta-path hook
and patches the class as soon as the module has executed, so that importing this module never
imports FastMCP (or mcp-once) by itself: start-up import tests see only what the server's own
use of the middleware imports.

`boot(stats_dir)` is what the `.pth` file that `run.py` writes into the suite's environment for
the guarded run calls at every interpreter start, so that servers built in child processes
(stdio servers, `fastmcp run`, subprocess tests, which get a sanitised environment) are guarded
too. Each process that built a guarded server writes `<pid>.count` to `stats_dir` at exit:
`<servers> <role> <the idempotency package's folder> <argv[0]> <argv[1]>`.

This file imports only `os` and `sys` at module level: it runs at every interpreter start.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

TARGET_MODULE = "fastmcp.server.server"
TARGET_CLASS = "FastMCP"
_MARK = "__mcp_once_guarded__"

_state: dict[str, Any] = {
    "count": 0,
    "stats_dir": None,
    "role": "child",
    "atexit": False,
    "source": "?",
}


def guarded_servers() -> int:
    """How many servers this process has given the middleware so far."""
    count: int = _state["count"]
    return count


def _write_stats() -> None:
    stats_dir = _state["stats_dir"]
    if not stats_dir or not _state["count"]:
        return
    try:
        os.makedirs(stats_dir, exist_ok=True)
        path = os.path.join(stats_dir, f"{os.getpid()}.count")
        with open(path, "w", encoding="utf-8") as handle:
            fields = [str(_state["count"]), _state["role"], _state["source"], *sys.argv[:2]]
            handle.write(" ".join(fields) + "\n")
    except OSError:
        pass


def set_stats_dir(stats_dir: str | None, role: str = "child") -> None:
    """Record, at this process's exit, how many servers it guarded in `stats_dir`.

    `role` is `pytest` for pytest's own processes (the plugin says so), `child` for the rest.
    """
    if not stats_dir:
        return
    _state["stats_dir"] = stats_dir
    _state["role"] = role
    if not _state["atexit"]:
        import atexit

        atexit.register(_write_stats)
        _state["atexit"] = True


def patch_class(cls: type) -> None:
    """Wrap `cls.__init__` (FastMCP's) to add the middleware; idempotent."""
    original = cls.__dict__["__init__"]
    if getattr(original, _MARK, False):
        return
    import functools

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        from idempotency import MemoryKeyStore
        from idempotency.fastmcp import IdempotencyMiddleware

        self.add_middleware(IdempotencyMiddleware(MemoryKeyStore()))
        _state["count"] += 1
        _state["source"] = os.path.dirname(sys.modules["idempotency"].__file__ or "?")

    setattr(__init__, _MARK, True)
    type.__setattr__(cls, "__init__", __init__)


def _patch_module(module: ModuleType) -> None:
    patch_class(getattr(module, TARGET_CLASS))


class _PatchOnImport:
    """A meta-path finder that patches FastMCP as soon as its module has executed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> Any:
        if fullname != TARGET_MODULE:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        exec_module: Callable[[ModuleType], None] = loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            _patch_module(module)

        loader.exec_module = exec_and_patch
        return spec


def install() -> None:
    """Guard every FastMCP server built from now on in this interpreter."""
    module = sys.modules.get(TARGET_MODULE)
    if module is not None and hasattr(module, TARGET_CLASS):
        _patch_module(module)
        return
    if not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def boot(stats_dir: str | None = None, snapshot: str | None = None) -> None:
    """Called from the guarded run's `.pth` at interpreter start.

    `snapshot`: a folder holding a copy of mcp-once's `idempotency` package, put first on the
    path so that every process of a run imports the same code, whatever happens to the working
    tree meanwhile.
    """
    if snapshot:
        sys.path.insert(0, snapshot)
    set_stats_dir(stats_dir)
    install()
