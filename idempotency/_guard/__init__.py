"""The guard: what happens to one keyed tool call, framework-free, one step per module.

Every entry point (`idempotent`, `install`, the low-level handler, the FastMCP middleware, all in
`_integrations/`) describes a call and hands it to `guard.Guard`; the guard speaks to the key
store only through the `KeyStore` protocol (`_stores/store.py`). A key's life, by file:

- `mint.py`: which key a call runs under, the client's (validated) or one derived from the call;
  `fingerprint.py` (what "the same call" means), `scope.py` (whose key it is, and the hashed
  store key a record lives under), `caller.py` (who a derived key is bound to);
- `guard.py`: claim, run, then complete or release; wait for and replay duplicates;
- `lease.py`: the claim renewed while the tool runs and until its result is stored;
- `complete.py`: the result stored, retried until it lands or the claim is gone;
- `replay.py`: stored results encoded, decoded and stamped with the replay marker;
- `current_claim.py`: the running call's claim, for a tool that fences its own writes.

Around them: `policy.py` (every knob, one frozen value), `errors.py` (the contract's JSON-RPC
errors), `telemetry.py` (logs, spans, metrics), `hooks.py` (`on_replay`), `advertise.py` (what
a guarded tool's definition tells clients). Public names are re-exported from `idempotency`.
"""
