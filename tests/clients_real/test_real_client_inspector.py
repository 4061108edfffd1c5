"""The MCP Inspector's CLI (npm `@modelcontextprotocol/inspector` 2.12.0, `--cli --method
tools/call`) against both servers, over stdio and streamable HTTP.

Each call is one `mcp-inspector --cli` process, as a person or a script runs it: over stdio that
process starts a new server process every time, so the replay below crosses server processes
(one SQLite store, one ledger).

What the Inspector CLI can do, and so which legs run:
- arguments: `--tool-arg k=v` (values that parse as JSON become JSON: `idempotency_key=7` is the
  number 7, refused as "must be a string"; a nested key is `--tool-arg 'meta={"...": "k"}'`) or
  `--tool-args-json` (verbatim; used for the empty-string key, which `--tool-arg` will not send);
- request `_meta`: `--tool-metadata k=v` puts `k` in `params._meta`, so the `_meta`-vs-argument
  legs run;
- headers: `--header "Idempotency-Key: v"` over HTTP. It trims the value and refuses an empty
  one itself (nothing is sent; shown below), so the empty-header case cannot reach the server
  from the Inspector; an over-long value and a tab inside the value do;
- errors: the CLI prints `{"error": {"code": "error", "message": ...}}` and exits non-zero; the
  JSON-RPC code (-32602) is not shown, so refusals are recognised by the server's message (which
  names the places and says nothing was run) and by the ledger and store.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import anyio
import pytest
from real_clients_kit import (
    HEADER_LEGS,
    KEY_LEGS,
    Call,
    Caller,
    NodeClients,
    Outcome,
    Served,
    bad_argument,
    charge,
    check_legs,
    fresh,
    meta_and_argument_disagree,
    nested_argument_key_twice,
)

pytestmark = pytest.mark.anyio

#: Every Inspector call is a process (and over stdio a server process too), so the Inspector
#: runs the legs that show what it can send; the server's checks of bad keys are the same
#: whatever the client, and run in full with the clients that keep one session
#: (`test_real_client_python.py`, `test_real_client_typescript.py`, `test_real_client_httpx.py`).
#: Of those, the Inspector sends the two its own argument syntax leads to: `idempotency_key=7`
#: (a number, by its JSON parsing) and the empty string.
STDIO_LEGS = [*KEY_LEGS, meta_and_argument_disagree]
HTTP_LEGS = [
    *KEY_LEGS,
    nested_argument_key_twice,
    bad_argument(7, "must be a string"),
    bad_argument("", "must not be empty"),
    meta_and_argument_disagree,
    *HEADER_LEGS,
]


def _as_tool_arg(value: object) -> str | None:
    """`value` as the Inspector's `--tool-arg` writes it, or None when `--tool-arg` cannot send
    it (it JSON-parses each value, and refuses an empty one)."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value or None
        return None  # would arrive as another JSON type
    return json.dumps(value)


@dataclass
class InspectorCaller(Caller):
    clients: NodeClients
    served: Served
    http: bool
    shows_codes = False

    def command(self, call: Call) -> list[str]:
        command = [*self.clients.inspector, "--cli", "--method", "tools/call"]
        command += ["--tool-name", call.tool]
        as_args = {name: _as_tool_arg(value) for name, value in call.arguments.items()}
        if all(value is not None for value in as_args.values()):
            command += ["--tool-arg", *(f"{name}={value}" for name, value in as_args.items())]
        else:
            command += ["--tool-args-json", json.dumps(call.arguments)]
        for name, value in (call.meta or {}).items():
            command += ["--tool-metadata", f"{name}={value}"]
        if call.header is not None:
            command += ["--header", f"Idempotency-Key: {call.header}"]
        if self.http:
            assert self.served.url is not None
            return [*command, "--transport", "http", self.served.url]
        return [*command, "--", *self.served.stdio_command()]

    async def send(self, call: Call) -> Outcome:
        done = await anyio.run_process(self.command(call), check=False)
        if done.returncode == 0:
            return Outcome(result=json.loads(done.stdout))
        lines = done.stderr.decode().strip().splitlines()
        envelope = json.loads(lines[-1]) if lines else {}
        assert "error" in envelope, (done.returncode, done.stdout, done.stderr)
        return Outcome(message=str(envelope["error"]["message"]))


async def test_inspector_cli(
    served_setting: tuple[Served, bool], node_clients: NodeClients
) -> None:
    served, http = served_setting
    legs = HTTP_LEGS if http else STDIO_LEGS
    await check_legs(legs, InspectorCaller(node_clients, served, http), served, concurrency=3)


async def test_inspector_cli_refuses_an_empty_header_itself(
    node_clients: NodeClients, http_servers: dict[str, Served]
) -> None:
    """`--header "Idempotency-Key: "` is the Inspector's own usage error: nothing reaches the
    server (so the server's empty-header refusal is shown with the other HTTP clients)."""
    served = http_servers["mcpserver"]
    order = fresh("emptyheader")
    refused = await InspectorCaller(node_clients, served, True).call(
        "charge", charge(order), header=""
    )
    assert refused.result is None and "Invalid header format" in refused.message
    assert (ran := served.effects(order)) == 0, f"{ran} effects, expected 0"
