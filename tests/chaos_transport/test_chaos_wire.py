"""The chaos link over real wires: a stdio subprocess and streamable HTTP on 127.0.0.1.

One scripted run per transport, era and backend walks through every fault kind; reading the
server's execution count after each step shows the fault did what it claims on that wire.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest
from chaos_helpers import EXPECTED_TIMEOUT, MODE, WAIT, http_server, stdio_params, text
from mcp import MCPError
from mcp.client import Client
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from orchestrator.chaos import Chaos, Fault, FaultPlan

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]

SCRIPT = {
    1: Fault.LOST_ACK,
    2: Fault.DUPLICATE,
    3: Fault.DROP_REQUEST,
    4: Fault.DELAY_REQUEST,
    5: Fault.DELAY_RESPONSE,
    6: Fault.CLOSE_AFTER_WRITE,
    7: Fault.CLOSE_BEFORE_WRITE,
}


def scripted_chaos() -> Chaos:
    plan = FaultPlan(schedule=SCRIPT, tools={"hit"}, delay_min_seconds=0.02, delay_max_seconds=0.02)
    return Chaos(plan, seed=11)


async def walk_the_script(
    client: Client, chaos: Chaos, executions: Callable[[], Awaitable[int]]
) -> None:
    """Faults 1-6 on one connection; `executions` reads the server's count of `hit` runs."""

    async def hit_expecting(code: int) -> None:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("hit", {}, read_timeout_seconds=EXPECTED_TIMEOUT)
        assert caught.value.code == code

    async def settle() -> None:
        with anyio.fail_after(WAIT):
            await chaos.settled()

    await client.list_tools()
    await hit_expecting(REQUEST_TIMEOUT)  # 1 lost ack: ran, answer swallowed
    await settle()
    assert await executions() == 1
    assert text(await client.call_tool("hit", {})) in {"2", "3"}  # 2 duplicate: ran twice
    await settle()
    assert await executions() == 3
    await hit_expecting(REQUEST_TIMEOUT)  # 3 dropped: never ran
    assert await executions() == 3
    assert text(await client.call_tool("hit", {})) == "4"  # 4 delayed request
    assert text(await client.call_tool("hit", {})) == "5"  # 5 delayed response
    await hit_expecting(CONNECTION_CLOSED)  # 6 close after write: outcome unknown
    await hit_expecting(CONNECTION_CLOSED)  # the link stays dead; not even numbered
    assert chaos.requests_seen == 6


@pytest.mark.parametrize(("anyio_backend", "era"), [("asyncio", "modern"), ("trio", "legacy")])
async def test_every_fault_over_stdio(era: str) -> None:
    chaos = scripted_chaos()
    transport = chaos.wrap(stdio_params())
    async with Client(transport, mode=MODE[era]) as client:

        async def executions() -> int:
            return int(text(await client.call_tool("count", {})))

        await walk_the_script(client, chaos, executions)
        assert transport.closed
    assert [record.kind for record in chaos.faults] == list(SCRIPT.values())[:6]


@pytest.mark.parametrize("era", ["modern", "legacy"])
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_every_fault_over_streamable_http(era: str) -> None:
    with http_server() as http:
        chaos = scripted_chaos()

        async def executions() -> int:
            return http.counting.executions

        async with Client(chaos.wrap(http.url), mode=MODE[era]) as client:
            await walk_the_script(client, chaos, executions)
        # Close-after-write delivered request 6: it may run (now or later) or not; nothing more.
        assert http.counting.executions in {5, 6}

        # Reconnect through the same Chaos: request 7 dies before its write, then the next passes.
        async with Client(chaos.wrap(http.url), mode=MODE[era]) as client:
            await client.list_tools()
            with pytest.raises(MCPError) as caught:
                await client.call_tool("hit", {"note": "seventh"})
            assert caught.value.code == CONNECTION_CLOSED
        async with Client(chaos.wrap(http.url), mode=MODE[era]) as client:
            await client.list_tools()
            await client.call_tool("hit", {"note": "eighth"})
    assert "eighth" in http.counting.notes
    assert "seventh" not in http.counting.notes  # request 7 never reached the server
    assert [record.kind for record in chaos.faults] == list(SCRIPT.values())
    assert [record.connection for record in chaos.faults] == [1, 1, 1, 1, 1, 1, 2]
    assert chaos.requests_seen == 8
