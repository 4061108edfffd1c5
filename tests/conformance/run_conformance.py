"""Run the official MCP conformance server suite against the fixture, unguarded and guarded.

For each mode the fixture server (`fixture_server.py`) is started once, on a free loopback port,
and the suite is run against it `--passes` times in a row: a second pass is a second set of
clients calling the same tools with the same arguments on a server that has already served them,
which is where a guard that merges calls across clients would show. Per-scenario results come
from the `checks.json` files the suite writes with `-o`: a scenario passes when it ran and none of
its checks is a FAILURE (warnings and infos do not fail it, as in the suite's own summary).

Exit status: 0 when the guarded server passes every scenario (in every pass) that the unguarded
one passes; 1 when it does not (or, with `--expect-all`, when the unguarded server fails one);
2 when the suite could not be run at all (the fixture did not start, the suite ran no scenario).

    uv run python tests/conformance/run_conformance.py \\
        --package /tmp/x/node_modules/@modelcontextprotocol/conformance -- --suite all
"""

from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

FIXTURE = Path(__file__).with_name("fixture_server.py")
MODES = ("unguarded", "guarded")
#: `server-<scenario>-<ISO timestamp with dashes>`, the directory the suite writes per scenario.
RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$")
RUNNING = re.compile(r"^=== Running scenario: (?P<scenario>\S+) ===$", re.MULTILINE)
READY = re.compile(r"conformance fixture at (?P<url>http://\S+/mcp)")

EXIT_OK, EXIT_REGRESSION, EXIT_NOT_RUN = 0, 1, 2


class NotRun(Exception):
    """The suite could not be run (the fixture did not start, the suite produced nothing)."""


@dataclass
class Scenario:
    """One scenario's result in one pass."""

    passed: bool
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


PassResult = dict[str, Scenario]


def read_results(output_dir: Path, ran: Sequence[str]) -> PassResult:
    """Per-scenario results from the suite's `checks.json` files; a scenario the suite started
    (`ran`) without writing results counts as failed."""
    results: PassResult = {}
    for checks_file in sorted(output_dir.glob("*/checks.json")):
        match = RESULT_DIR.match(checks_file.parent.name)
        if match is None:
            continue
        checks = json.loads(checks_file.read_text(encoding="utf-8"))
        failures, warnings = [], []
        for check in checks if isinstance(checks, list) else []:
            status = check.get("status")
            text = f"{check.get('id')}: {check.get('errorMessage') or check.get('description')}"
            if status == "FAILURE":
                failures.append(text)
            elif status == "WARNING":
                warnings.append(text)
        passed = isinstance(checks, list) and bool(checks) and not failures
        if not passed and not failures:
            failures.append("no checks recorded")
        results[match["scenario"]] = Scenario(passed, failures, warnings)
    for name in ran:
        results.setdefault(name, Scenario(False, ["the suite wrote no results (crashed?)"]))
    return results


@contextmanager
def fixture(mode: str, log: Path, start_timeout: float) -> Iterator[str]:
    """The fixture server in `mode`, running for the duration of the block; yields its URL."""
    command = [sys.executable, str(FIXTURE), "--port", "0", "--stop-on-stdin-eof"]
    if mode == "unguarded":
        command.append("--unguarded")
    with log.open("w", encoding="utf-8") as stderr:
        proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    try:
        yield _wait_ready(proc, log, start_timeout)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def _wait_ready(proc: subprocess.Popen[str], log: Path, timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not selector.select(timeout=left):
                break
            line = proc.stdout.readline()
            if not line:  # the fixture exited
                break
            if (match := READY.search(line)) is not None:
                print(f"    {line.strip()}", flush=True)
                return match["url"]
    tail = log.read_text(encoding="utf-8", errors="replace")[-2000:]
    raise NotRun(f"the fixture server did not start within {timeout:.0f} s:\n{tail}")


def run_pass(
    node_command: Sequence[str],
    url: str,
    suite_args: Sequence[str],
    output_dir: Path,
    timeout: float,
) -> PassResult:
    output_dir.mkdir(parents=True)
    command = [*node_command, "server", "--url", url, *suite_args, "-o", str(output_dir)]
    log = output_dir / "suite.log"
    try:
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        log.write_text(out, encoding="utf-8")
        raise NotRun(f"the suite did not finish within {timeout:.0f} s (log: {log})") from None
    log.write_text(completed.stdout + completed.stderr, encoding="utf-8")
    ran = [m["scenario"] for m in RUNNING.finditer(completed.stdout)]
    results = read_results(output_dir, ran)
    if not results:
        tail = (completed.stdout + completed.stderr)[-2000:]
        raise NotRun(f"the suite ran no scenario (exit {completed.returncode}):\n{tail}")
    return results


def _cell(results: Sequence[PassResult], scenario: str) -> str:
    """One mark per pass: pass, warn (passed with warnings), FAIL, or - (did not run)."""
    marks = []
    for result in results:
        found = result.get(scenario)
        if found is None:
            marks.append("-")
        elif not found.passed:
            marks.append("FAIL")
        else:
            marks.append("warn" if found.warnings else "pass")
    return " ".join(marks)


@dataclass(frozen=True)
class Finding:
    scenario: str
    pass_index: int
    why: str

    def __str__(self) -> str:
        return f"{self.scenario} (pass {self.pass_index}): {self.why}"


def compare(runs: dict[str, list[PassResult]]) -> tuple[list[Finding], list[Finding]]:
    """(guarded failures of scenario runs that pass unguarded, unguarded failures)."""
    regressions, bare_failures = [], []
    scenarios = sorted({name for mode in MODES for result in runs[mode] for name in result})
    pairs = list(zip(runs["unguarded"], runs["guarded"], strict=True))
    for name in scenarios:
        for index, (bare, wrapped) in enumerate(pairs, start=1):
            bare_result, wrapped_result = bare.get(name), wrapped.get(name)
            if bare_result is None or not bare_result.passed:
                why = "; ".join(bare_result.failures) if bare_result else "did not run"
                bare_failures.append(Finding(name, index, why))
            elif wrapped_result is None or not wrapped_result.passed:
                why = "; ".join(wrapped_result.failures) if wrapped_result else "did not run"
                regressions.append(Finding(name, index, why))
    return regressions, bare_failures


def report(
    label: str, runs: dict[str, list[PassResult]], expect_all: bool
) -> tuple[int, dict[str, object]]:
    regressions, bare_failures = compare(runs)
    scenarios = sorted({name for mode in MODES for result in runs[mode] for name in result})
    regressed = {finding.scenario for finding in regressions}
    passes = len(runs["unguarded"])
    width = max(len(name) for name in scenarios)
    cell = max(len("unguarded"), 5 * passes - 1)
    print(f"\n{label}: {len(scenarios)} scenarios, {passes} pass(es) per server")
    print(f"  {'scenario':<{width}}  {'unguarded':<{cell}}  {'guarded':<{cell}}")
    for name in scenarios:
        bare, wrapped = _cell(runs["unguarded"], name), _cell(runs["guarded"], name)
        flag = "  <-- guarded fails" if name in regressed else ""
        if not flag and bare != wrapped:
            flag = "  (results differ, not a failure)"
        print(f"  {name:<{width}}  {bare:<{cell}}  {wrapped:<{cell}}{flag}")

    def every_pass(mode: str) -> int:
        return sum(all(r.get(n, Scenario(False)).passed for r in runs[mode]) for n in scenarios)

    counts = {mode: every_pass(mode) for mode in MODES}
    print(
        f"  passed in every pass: unguarded {counts['unguarded']}/{len(scenarios)},"
        f" guarded {counts['guarded']}/{len(scenarios)} (every tool guarded by install())"
    )
    status = EXIT_OK
    if bare_failures:
        if expect_all:
            status = EXIT_REGRESSION
            print("  FAIL: the unguarded fixture itself fails (it is expected to pass everything):")
        else:
            print("  the unguarded fixture fails too (not held against mcp-once):")
        for finding in bare_failures:
            print(f"    - {finding}")
    if regressions:
        status = EXIT_REGRESSION
        print(
            f"  FAIL: the guarded server fails {len(regressions)} scenario run(s) that pass"
            " unguarded:"
        )
        for finding in regressions:
            print(f"    - {finding}")
    if status == EXIT_OK:
        print(f"  OK: the guarded server passes everything the unguarded one passes ({label})")
    summary: dict[str, object] = {
        "label": label,
        "scenarios": len(scenarios),
        "passes": passes,
        "passed_every_pass": counts,
        "regressions": [str(finding) for finding in regressions],
        "unguarded_failures": [str(finding) for finding in bare_failures],
        "results": {
            mode: [
                {
                    name: {"passed": s.passed, "failures": s.failures, "warnings": s.warnings}
                    for name, s in sorted(r.items())
                }
                for r in runs[mode]
            ]
            for mode in MODES
        },
    }
    return status, summary


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # run the `finally` blocks that stop the fixture servers


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run the MCP conformance server suite against the fixture, unguarded and"
        " guarded by mcp-once; arguments after -- go to `conformance server`."
    )
    parser.add_argument("--package", required=True, type=Path, help="the installed npm package")
    parser.add_argument("--label", default="conformance", help="name shown in the report")
    parser.add_argument("--node", default="node", help="the node binary (%(default)s)")
    parser.add_argument("--node-import", help="an ES module to preload (`node --import`)")
    parser.add_argument("--passes", type=int, default=2, help="suite runs per server (%(default)s)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per suite run")
    parser.add_argument("--results", type=Path, help="where to keep results (default: a temp dir)")
    parser.add_argument(
        "--expect-all", action="store_true", help="also fail if the unguarded fixture fails one"
    )
    parser.add_argument("suite_args", nargs="*", help="e.g. --suite all")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)

    entry = args.package / "dist" / "index.js"
    if not entry.is_file():
        print(f"conformance: {entry} not found (is the npm package installed?)", file=sys.stderr)
        return EXIT_NOT_RUN
    node_command = [args.node]
    if args.node_import:
        node_command += ["--import", Path(args.node_import).resolve().as_uri()]
    node_command.append(str(entry))
    results_dir: Path = args.results or Path(os.environ.get("TMPDIR", "/tmp")) / (
        f"mcp-once-conformance-{os.getpid()}"
    )
    started = time.monotonic()
    runs: dict[str, list[PassResult]] = {mode: [] for mode in MODES}
    try:
        for mode in MODES:
            print(f"  {args.label}: {mode} fixture, {args.passes} pass(es)", flush=True)
            mode_dir = results_dir / mode
            mode_dir.mkdir(parents=True, exist_ok=True)
            with fixture(mode, mode_dir / "server.log", start_timeout=60) as url:
                for index in range(1, args.passes + 1):
                    out = mode_dir / f"pass{index}"
                    result = run_pass(node_command, url, args.suite_args, out, args.timeout)
                    runs[mode].append(result)
                    failed = sorted(n for n, s in result.items() if not s.passed)
                    print(
                        f"    pass {index}: {len(result) - len(failed)}/{len(result)} passed"
                        + (f" (failed: {', '.join(failed)})" if failed else ""),
                        flush=True,
                    )
    except NotRun as exc:
        print(f"conformance ({args.label}): NOT RUN: {exc}", file=sys.stderr)
        return EXIT_NOT_RUN
    status, summary = report(args.label, runs, args.expect_all)
    summary["seconds"] = round(time.monotonic() - started, 1)
    (results_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(f"  ({summary['seconds']} s; results in {results_dir})")
    return status


if __name__ == "__main__":
    sys.exit(main())
