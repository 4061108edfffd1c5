"""`mcp-once serve-example` refuses to start, with a clear sentence and an exit code, when its
store URL is bad (2), its store cannot be reached (3), or its address cannot be listened on (1).

Serving itself is exercised end to end in tests/examples/ (real processes and clients).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from redis_server import free_port

from mcp_once._cli import main


def serve(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Runs `mcp-once serve-example *argv`, expected to refuse before serving."""
    capsys.readouterr()
    try:
        code = main(["serve-example", *argv])
    except SystemExit as exited:
        assert isinstance(exited.code, int)
        code = exited.code
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert "example server at" not in err  # it never listened
    return code, err


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("foo://x", "unknown key store scheme 'foo'"),
        ("sqlite:///", "names no file"),
        ("memory://somewhere", "the memory store takes no location"),
    ],
)
def test_a_bad_store_url_exits_2(url: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = serve(capsys, "--port", "0", "--store", url)
    assert code == 2 and err.startswith("mcp-once: bad key store URL:") and why in err


def test_an_unreachable_redis_exits_3_before_listening(
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_port()
    code, err = serve(capsys, "--port", "0", "--store", f"redis://:pw@127.0.0.1:{port}/0")
    assert code == 3
    assert err.startswith(f"mcp-once: the key store at 'redis://:***@127.0.0.1:{port}/0' cannot")
    assert "example server at" not in err and ":pw@" not in err


def test_an_sqlite_file_in_a_missing_directory_exits_3(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = serve(capsys, "--port", "0", "--store", f"sqlite:///{tmp_path}/nowhere/k.db")
    assert code == 3 and "does not exist" in err
    assert not (tmp_path / "nowhere").exists()


def test_a_foreign_sqlite_file_exits_3_and_is_left_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    foreign = tmp_path / "notes.txt"
    foreign.write_bytes(b"not a database, and not ours to touch" * 200)
    before = foreign.read_bytes()
    code, err = serve(capsys, "--port", "0", "--store", f"sqlite:///{foreign}")
    assert code == 3 and str(foreign) in err
    assert foreign.read_bytes() == before
    # As a plain path, a name without an SQLite file's extension is no store at all (issue 38).
    code, err = serve(capsys, "--port", "0", "--store", str(foreign))
    assert code == 2 and "is neither a URL" in err
    assert foreign.read_bytes() == before


@pytest.mark.parametrize("port", ["-1", "65536"])
def test_a_port_out_of_range_exits_2(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = serve(capsys, "--port", port, "--store", "memory://")
    assert code == 2 and "--port must be between 0 and 65535" in err


def test_a_busy_port_exits_1_with_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = serve(capsys, "--port", str(port), "--store", "memory://")
    assert code == 1 and f"cannot listen on 127.0.0.1:{port}" in err
