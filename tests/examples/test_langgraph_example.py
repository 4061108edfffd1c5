"""examples/langgraph_agent.py, run as a user runs it: in the LangGraph environment, against
`mcp-once serve-example` in this one. Its first run loses the answer after the server charged,
the resumed thread sends the call again under the same key: replayed, one charge, which the
server's key store (read here, from outside) confirms: one record, executed once.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import anyio
import pytest
from test_examples import EXAMPLES, ROOT, SERVE_BANNER, SOON, ServerProcess, console_script

from idempotency import RecordState, SQLiteKeyStore

sys.path.insert(0, str(Path(__file__).parents[1] / "durable"))
from langgraph_env import langgraph_python

CHARGED = re.compile(r"charged: (\{.*\})")
COUNT = re.compile(r"charges for (order-[0-9a-f]{8}): 1")


@pytest.mark.anyio
async def test_the_langgraph_example_charges_once_across_a_resume(tmp_path: Path) -> None:
    python = langgraph_python()
    db = tmp_path / "keys.sqlite3"
    server = ServerProcess(
        [console_script(), "serve-example", "--port", "0", "--store", f"sqlite:///{db}"],
        cwd=tmp_path,
    )
    try:
        url = server.wait_for(SERVE_BANNER).group(1)
        with anyio.fail_after(SOON):
            done = await anyio.run_process(
                [str(python), str(EXAMPLES / "langgraph_agent.py"), url], cwd=ROOT, check=False
            )
    finally:
        assert server.stop() == 0, server.seen
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 4, lines
    assert lines[0].startswith("first run failed: "), lines
    assert lines[1] == "resumed: replayed", lines
    charged, count = CHARGED.fullmatch(lines[2]), COUNT.fullmatch(lines[3])
    assert charged and count, lines
    assert json.loads(charged.group(1))["order_id"] == count.group(1)
    store = SQLiteKeyStore(db)
    try:
        records = await store.list_records(state=RecordState.COMPLETED)
    finally:
        await store.aclose()
    assert [record.attempts for record in records] == [1]
