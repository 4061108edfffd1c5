"""mcp-once, the application: what uses both libraries, so that neither has to know the other.

- `mcp_once._cli`: the `mcp-once` command (`demo`, `serve-example`, `keys`, `bench`); also
  `python -m mcp_once`.
- `mcp_once.scenarios`: the scenario engine behind the chaos suite, the soak and the demo.

`idempotency` (the server library) imports nothing of ours or of `orchestrator`; `orchestrator`
(the client library) imports only the wire contract, `idempotency.wire`. Nothing imports this
package but tests, benchmarks and the console script (`tests/test_layout.py` holds the rule).
"""
