"""`examples/fastmcp_server.py` is documentation: it runs as a user would run it, and the
unchanged HTTP client example sees each charge happen once although it sends it twice."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))

from test_examples import (
    EXAMPLES,
    UVICORN_BANNER,
    ServerProcess,
    check_http_client_output,
    check_once_from_outside,
    run_example,
)


@pytest.mark.anyio
async def test_fastmcp_example_server_with_the_http_client(tmp_path: Path) -> None:
    server = ServerProcess(
        [sys.executable, str(EXAMPLES / "fastmcp_server.py"), "--port", "0"], cwd=tmp_path
    )
    try:
        url = server.wait_for(UVICORN_BANNER).group(1) + "/mcp"
        runs = [check_http_client_output(run_example("examples/client_http.py", url))]
        runs.append(check_http_client_output(run_example("examples/client_http.py", url)))
        for run in runs:
            await check_once_from_outside(url, run)
    finally:
        assert server.stop() == 0, server.seen
    # FastMCP's banner (and its check for a newer FastMCP) is not the example's to show.
    assert not any("FastMCP" in line or "Update available" in line for line in server.seen)
    # The default store: the embedded SQLite file, under the working directory.
    assert (tmp_path / ".mcp-once" / "keys.sqlite3").is_file()
