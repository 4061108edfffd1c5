"""SQLite key store: claim+complete pairs per second at 1 and 16 concurrent callers.

The workload is `store_throughput`'s (unique keys, the guard's key and fingerprint, 200-byte
results), on `SQLiteKeyStore` over a fresh file per measurement, one asyncio process.
Contenders, interleaved within each round (the order alternates round by round):

* `full`: this checkout's store, `synchronous=FULL` (the default: group commit on its writer
  thread, every caller answered after its batch's fsync);
* `normal`: this checkout's store with the opt-in `synchronous="normal"` (no fsync per commit);
* `baseline` (with `--baseline TREE`): the store of another checkout, e.g. the main branch, at
  its default; measured in the same run so that the ratio `full / baseline` is paired per round.

Each measurement runs in its own subprocess, so each imports `idempotency` from its own tree and
no measurement inherits another's threads or page cache state.

    uv run python -m benchmarks.sqlite_throughput [--quick] [--baseline /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ._scale import FULL, QUICK
from ._stats import spread

CONCURRENCY = (1, 16)
HERE = Path(__file__).resolve().parents[1]


def _child(tree: str, synchronous: str, concurrency: int, duration: float) -> None:
    """One measurement, in this process: prints the rate."""
    sys.path.insert(0, tree)
    import anyio

    from benchmarks import _workload
    from benchmarks._timing import async_rate
    from idempotency import SQLiteKeyStore

    with tempfile.TemporaryDirectory() as folder:
        options: dict[str, Any] = {} if synchronous == "full" else {"synchronous": synchronous}
        store = SQLiteKeyStore(Path(folder) / "keys.db", **options)
        result = _workload.result_bytes()

        async def pair(n: int) -> None:
            key, fp = _workload.call_names("sqlite", n)
            outcome = await store.claim(key, fp, lease=_workload.LEASE, takeover=False)
            assert outcome.token is not None, outcome
            stored = await store.complete(key, outcome.token, result, retention=_workload.RETENTION)
            assert stored

        async def main() -> float:
            try:
                return await async_rate(concurrency, duration, pair)
            finally:
                await store.aclose()

        print(anyio.run(main))


def _measure_once(tree: Path, synchronous: str, concurrency: int, duration: float) -> float:
    command = [
        sys.executable,
        "-m",
        "benchmarks.sqlite_throughput",
        "--child",
        str(tree),
        synchronous,
        str(concurrency),
        str(duration),
    ]
    done = subprocess.run(
        command, cwd=HERE, capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr}")
    return float(done.stdout.strip().splitlines()[-1])


def measure(rounds: int, duration: float, baseline: Path | None) -> dict[str, Any]:
    contenders: dict[str, tuple[Path, str]] = {"full": (HERE, "full"), "normal": (HERE, "normal")}
    if baseline is not None:
        contenders["baseline"] = (baseline, "full")
    samples: dict[str, dict[int, list[float]]] = {
        c: {n: [] for n in CONCURRENCY} for c in contenders
    }
    load_before = os.getloadavg()
    for round_no in range(rounds):
        for concurrency in CONCURRENCY:
            order = list(contenders) if round_no % 2 == 0 else list(contenders)[::-1]
            for name in order:
                tree, synchronous = contenders[name]
                rate = _measure_once(tree, synchronous, concurrency, duration)
                samples[name][concurrency].append(rate)
    out: dict[str, Any] = {
        "unit": "claim+complete pairs per second (median of rounds, with min and max)",
        "rounds": rounds,
        "window_seconds": duration,
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "contenders": {
            name: {str(n): spread(by[n], 0) for n in CONCURRENCY} for name, by in samples.items()
        },
    }
    if baseline is not None:
        out["baseline_tree"] = str(baseline)
        out["full_vs_baseline"] = {
            str(n): spread(
                [a / b for a, b in zip(samples["full"][n], samples["baseline"][n], strict=True)]
            )
            for n in CONCURRENCY
        }
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        tree, synchronous, concurrency, duration = sys.argv[2:6]
        _child(tree, synchronous, int(concurrency), float(duration))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round of short windows")
    parser.add_argument("--baseline", type=Path, help="another checkout's tree to compare with")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default: 3, quick: 1)")
    args = parser.parse_args()
    scale = QUICK if args.quick else FULL
    rounds = args.rounds or (scale.throughput_rounds if args.quick else 3)
    duration = scale.throughput_window if args.quick else 1.5
    print(json.dumps(measure(rounds, duration, args.baseline), indent=2))


if __name__ == "__main__":
    main()
