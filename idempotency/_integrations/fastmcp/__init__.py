"""The internals of `idempotency.fastmcp.IdempotencyMiddleware` (FastMCP 4.x).

The middleware itself stays in the public module `idempotency/fastmcp.py`, where users import it
and where its choices are documented. Here: `results.py` translates FastMCP's answers to the
guard's terms and back, and `body.py` tells whether FastMCP entered the tool. Both import
FastMCP, so nothing outside `idempotency.fastmcp` imports them.
"""
