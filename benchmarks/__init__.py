"""mcp-once benchmarks: the cost of safety, each figure measured against its baseline in one run.

Not part of the installed package: run from a checkout (`uv run --group bench python -m
benchmarks.run`) or through `mcp-once bench`. See `benchmarks/README.md`.
"""
