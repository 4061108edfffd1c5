"""Every example parses its command line (issue 38): `--help` prints its usage and exits 0,
instead of being taken for a URL and retried, or ignored while the example runs. Each runs as a
user runs it, all at once (they only import and parse). An example whose framework is not
installed in this environment (the LangGraph one has its own) is reported, not failed."""

from __future__ import annotations

import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(
    path
    for path in (ROOT / "examples").glob("*.py")
    if 'if __name__ == "__main__":' in path.read_text()
)


@dataclass(frozen=True)
class Answer:
    code: int
    out: str
    err: str


@pytest.fixture(scope="module")
def answers() -> dict[str, Answer]:
    """`python EXAMPLE --help` for every example, run all at once."""
    running = {
        path.name: subprocess.Popen(
            [sys.executable, str(path), "--help"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path in EXAMPLES
    }
    found: dict[str, Answer] = {}
    for name, proc in running.items():
        out, err = proc.communicate(timeout=300)
        found[name] = Answer(proc.returncode, out, err)
    return found


@pytest.mark.parametrize("name", [path.name for path in EXAMPLES])
def test_the_example_answers_help(name: str, answers: dict[str, Answer]) -> None:
    answer = answers[name]
    if answer.code != 0 and "ModuleNotFoundError" in answer.err:
        pytest.skip(f"{name}: its framework is not installed here")
    assert answer.code == 0, f"{name}: {answer.err}"
    assert answer.out.startswith("usage: "), f"{name} printed no usage: {answer.out[:200]!r}"


def test_the_examples_are_found() -> None:
    assert len(EXAMPLES) >= 10


def test_the_http_client_without_a_server_says_so() -> None:
    """The README's first failure: no server up. One sentence naming the refusal and the URL
    (its password redacted), a hint, exit 1; no traceback, no JSON-RPC -32603, no 503."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again below: nobody listens there
    url = f"http://shop:s3cret@127.0.0.1:{port}/mcp"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "client_http.py"), url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert "Traceback" not in done.stderr and "s3cret" not in done.stderr
    assert "NotExecuted: tool 'charge' was not executed" in done.stderr
    assert f"connection refused: http://shop:***@127.0.0.1:{port}/mcp" in done.stderr
    assert "-32603" not in done.stderr and "503" not in done.stderr
    assert "mcp-once serve-example" in done.stderr
