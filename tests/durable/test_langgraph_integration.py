"""The LangGraph integration (`integrations/langgraph`, the `mcp-once-langgraph` distribution)
seen from mcp-once's side: it cannot import mcp-once (its environment has `mcp` < 2), so it
carries a transcription of the key derivation and of the wire names; these tests hold the two
to the originals, keep the distribution's independence, and run its own unit tests in its own
environment.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import tomllib
from types import ModuleType

from langgraph_env import PROJECT, langgraph_python

from idempotency import wire
from orchestrator._key import derive_key

PACKAGE = PROJECT / "mcp_once_langgraph"
#: Shared with the integration's own tests (integrations/langgraph/tests): one vector, both sides.
VECTOR = (
    "thread-1",
    "tools:7d6c2d1e-0d54-5c0e-9f63-2b4f1f0f3c11",
    "1f0a2b3c-4d5e-6f70-8001-123456789abc",
    "call-1",
    "pay",
)
VECTOR_KEY = "langgraph-c4a6c64ad9170d51e536670ec98425fa175d4809"


def transcription() -> ModuleType:
    """The integration's `_key.py`, loaded by path: it needs only the standard library."""
    spec = importlib.util.spec_from_file_location("_langgraph_key", PACKAGE / "_key.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_langgraph_key_is_mcp_once_s_derive_key() -> None:
    key = transcription()
    names = ("thread_id", "checkpoint_ns", "checkpoint_id", "tool_call_id", "tool")
    assert key.checkpoint_key(**dict(zip(names, VECTOR, strict=True))) == VECTOR_KEY
    assert derive_key("langgraph", *VECTOR) == VECTOR_KEY
    assert wire.key_problem(VECTOR_KEY) is None
    odd = ("", "ns|with:separators", "ü-ñ 🙂", '"quoted", [json]', "x" * 300)
    for parts in (odd, odd[::-1], ("a", "b"), ()):
        assert key.derive_key("langgraph", *parts) == derive_key("langgraph", *parts)
        assert wire.key_problem(key.derive_key("langgraph", *parts)) is None


def test_the_langgraph_wire_names_are_mcp_once_s() -> None:
    key = transcription()
    assert key.KEY_META == wire.KEY_META
    assert key.IDEMPOTENCY_META == wire.IDEMPOTENCY_META


def test_the_langgraph_distribution_stands_alone() -> None:
    """No import of mcp-once's packages (they need `mcp` 2), no dependency on mcp-once or `mcp`
    2, and the transcription imports only the standard library."""
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                top = name.split(".")[0]
                assert top not in ("mcp_once", "orchestrator", "idempotency"), (path, name)
                if path.name == "_key.py":
                    assert top in sys.stdlib_module_names, (path, name)
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "mcp-once-langgraph"
    assert not [d for d in project["dependencies"] if d.startswith(("mcp-once", "mcp>", "mcp="))]


def test_the_langgraph_integration_s_own_tests_pass() -> None:
    python = langgraph_python()
    done = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout
