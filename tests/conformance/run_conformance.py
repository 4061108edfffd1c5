"""Run the official MCP conformance server suite against the fixture: unguarded, guarded, and
unguarded behind `mcp-once proxy`, as a proxy of one upstream and as a gateway.

Four modes, each one server started once on a free loopback port:
- `unguarded`: the fixture server (`fixture_server.py`) bare, the baseline;
- `guarded`: the fixture with every tool guarded by `idempotency.install()`;
- `proxied`: `mcp-once proxy --listen` (HTTP front, SQLite store) in front of the unguarded
  fixture as its `--upstream` (streamable HTTP: the fixture serves HTTP only);
- `gateway`: `mcp-once proxy --listen --config FILE` with no `--server`, the front of every
  entry of FILE (`mcp_once.proxy.gateway`), FILE's one entry the unguarded fixture's URL: the
  gateway's own parts (the upstream's proxy mounted, calls dispatched to it, completion routed)
  under the suites. With one entry nothing is prefixed, as in FastMCP's proxy of a one-server
  config; the suites call the fixture's tools, prompts and resources by their own names.
The suite is run against each `--passes` times in a row: a second pass is a second set of
clients calling the same tools with the same arguments on a server that has already served them,
which is where a guard that merges calls across clients would show. Per-scenario results come
from the `checks.json` files the suite writes with `-o`: a scenario passes when it ran and none of
its checks is a FAILURE (warnings and infos do not fail it, as in the suite's own summary).

A scenario run that passes unguarded must pass in the other modes, with one allowance: the
checks `PROXY_EXCEPTIONS` lists may fail through the proxy (either front), each with the reason
it cannot hold there. A proxied failure of any other check fails the run; a listed scenario that
passes through the proxy is reported (the list is stale), not failed.

Exit status: 0 when every mode passes every scenario (in every pass) that the unguarded server
passes, allowances aside; 1 when one does not (or, with `--expect-all`, when the unguarded server
fails one); 2 when the suite could not be run at all (a server did not start, the suite ran no
scenario).

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
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

FIXTURE = Path(__file__).with_name("fixture_server.py")
BASELINE = "unguarded"
MODES = (BASELINE, "guarded", "proxied", "gateway")
#: `server-<scenario>-<ISO timestamp with dashes>`, the directory the suite writes per scenario.
RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$")
RUNNING = re.compile(r"^=== Running scenario: (?P<scenario>\S+) ===$", re.MULTILINE)
READY = re.compile(r"conformance fixture at (?P<url>http://\S+/mcp)")
PROXY_READY = re.compile(r"mcp-once proxy at (?P<url>http://\S+/mcp)")

EXIT_OK, EXIT_REGRESSION, EXIT_NOT_RUN = 0, 1, 2


class NotRun(Exception):
    """The suite could not be run (a server did not start, the suite produced nothing)."""


@dataclass
class Scenario:
    """One scenario's result in one pass; `failed_checks` names the checks that failed."""

    passed: bool
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    failed_checks: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Allowance:
    """Checks of one scenario that may fail through the proxy, and why they cannot hold there."""

    checks: frozenset[str]
    why: str


_INPUT_REQUIRED_CAPABILITIES = (
    "SEP-2322 + SEP-2575: the caller's client capabilities do not reach the upstream; the"
    " upstream sees those of the proxy's own 2026-07-28 session, so it asks for input the caller"
    " did not declare (as in server-stateless; FastMCP's bare create_proxy too)"
)
_NOT_SUBSCRIBED = (
    "FastMCP's proxy serves neither resources/subscribe nor resources/unsubscribe (-32601 Method"
    " not found), nor relays the upstream's resource-updated notifications a subscription would"
    " bring; FastMCP's bare create_proxy fails them the same way"
)

#: What cannot hold through `mcp-once proxy` (both suites: a scenario only one of them runs is
#: only looked at there). Each names the failing checks, so any other check of the scenario
#: still counts.
PROXY_EXCEPTIONS: Mapping[str, Allowance] = {
    "resources-subscribe": Allowance(frozenset({"resources-subscribe"}), _NOT_SUBSCRIBED),
    "resources-unsubscribe": Allowance(frozenset({"resources-unsubscribe"}), _NOT_SUBSCRIBED),
    "server-stateless": Allowance(
        frozenset(
            {
                "sep-2575-server-rejects-undeclared-capability",
                "sep-2575-missing-capability-http-400",
            }
        ),
        "SEP-2575: the caller's client capabilities do not reach the upstream; the upstream sees"
        " those of the proxy's own session (which declares sampling), so it runs the tool that"
        " requires sampling instead of answering -32021 (FastMCP's bare create_proxy too)",
    ),
    "input-required-result-capability-check": Allowance(
        frozenset({"sep-2322-respect-client-capabilities"}), _INPUT_REQUIRED_CAPABILITIES
    ),
}
#: The allowances of each mode (only the proxy's two fronts have any: the same).
ALLOWANCES: Mapping[str, Mapping[str, Allowance]] = {
    "proxied": PROXY_EXCEPTIONS,
    "gateway": PROXY_EXCEPTIONS,
}


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
        failures, warnings, failed = [], [], set()
        for check in checks if isinstance(checks, list) else []:
            status = check.get("status")
            text = f"{check.get('id')}: {check.get('errorMessage') or check.get('description')}"
            if status == "FAILURE":
                failures.append(text)
                failed.add(str(check.get("id")))
            elif status == "WARNING":
                warnings.append(text)
        passed = isinstance(checks, list) and bool(checks) and not failures
        if not passed and not failures:
            failures.append("no checks recorded")
        results[match["scenario"]] = Scenario(passed, failures, warnings, frozenset(failed))
    for name in ran:
        results.setdefault(name, Scenario(False, ["the suite wrote no results (crashed?)"]))
    return results


@contextmanager
def server(mode: str, folder: Path, start_timeout: float) -> Iterator[str]:
    """The server of `mode`, running for the duration of the block; yields its URL."""
    with ExitStack() as stack:
        unguarded = mode != "guarded"
        url = stack.enter_context(_fixture(unguarded, folder / "server.log", start_timeout))
        if mode in ("proxied", "gateway"):
            store = stack.enter_context(tempfile.TemporaryDirectory(prefix="mcp-once-conf-px-"))
            command = [sys.executable, "-m", "mcp_once", "proxy", "--listen", "127.0.0.1:0"]
            command += ["--store", f"sqlite:///{store}/keys.sqlite3"]
            if mode == "proxied":
                command += ["--upstream", url]
            else:
                config = Path(store) / "gateway.json"
                config.write_text(json.dumps({"mcpServers": {"conformance": {"url": url}}}))
                command += ["--config", str(config)]
            # Its manifest in the temporary folder, not the user's state folder.
            env = {**os.environ, "XDG_STATE_HOME": store}
            url = stack.enter_context(_proxy(command, env, folder / "proxy.log", start_timeout))
        yield url


@contextmanager
def _fixture(unguarded: bool, log: Path, start_timeout: float) -> Iterator[str]:
    """The fixture server, announcing its URL on stdout, its stderr in `log`."""
    command = [sys.executable, str(FIXTURE), "--port", "0", "--stop-on-stdin-eof"]
    if unguarded:
        command.append("--unguarded")
    with log.open("w", encoding="utf-8") as stderr:
        proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    with _stopped(proc):
        assert proc.stdout is not None
        yield _wait_ready(proc.stdout, READY, log, "the fixture server", start_timeout)


@contextmanager
def _proxy(
    command: list[str], env: Mapping[str, str], log: Path, start_timeout: float
) -> Iterator[str]:
    """`mcp-once proxy --listen`, announcing its URL on stderr; the rest of its stderr is copied
    to `log` (read as it comes, so a chatty proxy never blocks on a full pipe)."""
    proc = subprocess.Popen(
        command,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    with log.open("w", encoding="utf-8") as copy:
        stderr = _Tee(proc.stderr, copy)
        copier = threading.Thread(target=stderr.drain, name="proxy-stderr", daemon=True)
        # The copier ends at the end of the stream, once the proxy is stopped, before the pipe
        # and the log are closed.
        with _stopped(proc, after=lambda: copier.join(timeout=10) if copier.ident else None):
            url = _wait_ready(stderr, PROXY_READY, log, "mcp-once proxy", start_timeout)
            copier.start()
            yield url


class _Tee:
    """A process's output read line by line, each line also written to a log file."""

    def __init__(self, source: Any, copy: Any) -> None:
        self._source, self._copy = source, copy

    def fileno(self) -> int:
        return int(self._source.fileno())

    def readline(self) -> str:
        line = str(self._source.readline())
        self._copy.write(line)
        self._copy.flush()
        return line

    def drain(self) -> None:
        while self.readline():
            pass


@contextmanager
def _stopped(
    proc: subprocess.Popen[str], after: Callable[[], None] = lambda: None
) -> Iterator[None]:
    """Terminate `proc` when the block ends (killed if it does not stop within 10 s), call
    `after`, then close its pipes."""
    try:
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        after()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _wait_ready(out: Any, ready: re.Pattern[str], log: Path, what: str, timeout: float) -> str:
    """The URL of `ready`'s first match in the lines of `out` (a pipe, or a `_Tee` of one)."""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(out, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not selector.select(timeout=left):
                break
            line = out.readline()
            if not line:  # the process exited
                break
            if (match := ready.search(line)) is not None:
                print(f"    {line.strip()}", flush=True)
                return match["url"]
    tail = log.read_text(encoding="utf-8", errors="replace")[-2000:]
    raise NotRun(f"{what} did not start within {timeout:.0f} s:\n{tail}")


def run_pass(
    node_command: Sequence[str],
    url: str,
    suite_args: Sequence[str],
    output_dir: Path,
    timeout: float,
    scenarios: Sequence[str] = (),
) -> PassResult:
    """One run of the suite (`suite_args`), or, with `scenarios`, one `--scenario` run of each
    in turn (how the suite runs an extension's scenarios: no suite selects them at a spec
    version), into `output_dir`."""
    output_dir.mkdir(parents=True)
    base = [*node_command, "server", "--url", url, *suite_args, "-o", str(output_dir)]
    runs = [[*base, "--scenario", name] for name in scenarios] or [base]
    outputs: list[str] = []
    ran, returncode = list(scenarios), 0
    for command in runs:
        try:
            completed = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
            (output_dir / "suite.log").write_text("".join(outputs) + out, encoding="utf-8")
            raise NotRun(f"the suite did not finish within {timeout:.0f} s") from None
        outputs.append(completed.stdout + completed.stderr)
        returncode = returncode or completed.returncode
        if not scenarios:
            ran = [m["scenario"] for m in RUNNING.finditer(completed.stdout)]
    (output_dir / "suite.log").write_text("".join(outputs), encoding="utf-8")
    results = read_results(output_dir, ran)
    if not results:
        tail = "".join(outputs)[-2000:]
        raise NotRun(f"the suite ran no scenario (exit {returncode}):\n{tail}")
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


@dataclass
class Comparison:
    """One mode against the baseline: `regressions` fail the run; `allowed` are failures of
    checks its allowances list; `stale` names allowed scenarios that passed in every pass."""

    regressions: list[Finding] = field(default_factory=list)
    allowed: list[Finding] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)


def _why(result: Scenario | None) -> str:
    return "; ".join(result.failures) if result else "did not run"


def compare(
    runs: Mapping[str, list[PassResult]],
    allowances: Mapping[str, Mapping[str, Allowance]] = ALLOWANCES,
) -> tuple[dict[str, Comparison], list[Finding]]:
    """(each mode's comparison with the baseline, the baseline's own failures)."""
    scenarios = sorted({name for results in runs.values() for result in results for name in result})
    bare_failures = [
        Finding(name, index, _why(result.get(name)))
        for name in scenarios
        for index, result in enumerate(runs[BASELINE], start=1)
        if not result.get(name, Scenario(False)).passed
    ]
    comparisons: dict[str, Comparison] = {}
    for mode, results in runs.items():
        if mode == BASELINE:
            continue
        allowed_here = allowances.get(mode, {})
        found = comparisons[mode] = Comparison()
        for name in scenarios:
            allowance = allowed_here.get(name)
            pairs = zip(runs[BASELINE], results, strict=True)
            for index, (bare, wrapped) in enumerate(pairs, start=1):
                bare_result, result = bare.get(name), wrapped.get(name)
                if bare_result is None or not bare_result.passed:
                    continue
                if result is not None and result.passed:
                    continue
                excused = (
                    allowance is not None
                    and result is not None
                    and bool(result.failed_checks)
                    and result.failed_checks <= allowance.checks
                )
                (found.allowed if excused else found.regressions).append(
                    Finding(name, index, _why(result))
                )
            ran = [result[name] for result in results if name in result]
            if allowance is not None and ran and all(r.passed for r in ran):
                found.stale.append(name)
    return comparisons, bare_failures


def report(
    label: str, runs: dict[str, list[PassResult]], expect_all: bool
) -> tuple[int, dict[str, object]]:
    comparisons, bare_failures = compare(runs)
    modes = list(runs)
    scenarios = sorted({name for results in runs.values() for result in results for name in result})
    passes = len(runs[BASELINE])
    width = max(len(name) for name in scenarios)
    cell = max(len("unguarded"), 5 * passes - 1)
    print(f"\n{label}: {len(scenarios)} scenarios, {passes} pass(es) per server")
    print("  " + "  ".join([f"{'scenario':<{width}}", *(f"{m:<{cell}}" for m in modes)]))
    for name in scenarios:
        cells = [_cell(runs[mode], name) for mode in modes]
        flags = []
        for mode, found in comparisons.items():
            if any(f.scenario == name for f in found.regressions):
                flags.append(f"<-- {mode} fails")
            elif any(f.scenario == name for f in found.allowed):
                flags.append(f"({mode}: allowed, see below)")
        if not flags and len(set(cells)) > 1:
            flags.append("(results differ, not a failure)")
        row = "  ".join([f"{name:<{width}}", *(f"{c:<{cell}}" for c in cells)])
        print(f"  {row}  {' '.join(flags)}".rstrip())

    def every_pass(mode: str) -> int:
        return sum(all(r.get(n, Scenario(False)).passed for r in runs[mode]) for n in scenarios)

    counts = {mode: every_pass(mode) for mode in modes}
    shown = ", ".join(f"{mode} {counts[mode]}/{len(scenarios)}" for mode in modes)
    print(f"  passed in every pass: {shown}")
    status = EXIT_OK
    if bare_failures:
        if expect_all:
            status = EXIT_REGRESSION
            print("  FAIL: the unguarded fixture itself fails (it is expected to pass everything):")
        else:
            print("  the unguarded fixture fails too (not held against mcp-once):")
        for finding in bare_failures:
            print(f"    - {finding}")
    for mode, found in comparisons.items():
        if found.allowed:
            reasons: dict[str, dict[str, list[int]]] = {}
            for finding in found.allowed:
                why = ALLOWANCES[mode][finding.scenario].why
                reasons.setdefault(why, {}).setdefault(finding.scenario, []).append(
                    finding.pass_index
                )
            print(f"  {mode}: {len(found.allowed)} scenario run(s) fail as allowed:")
            for why, where in reasons.items():
                named = ", ".join(
                    f"{name} (pass {', '.join(map(str, indexes))})"
                    for name, indexes in where.items()
                )
                print(f"    - {named}\n      because {why}")
        if found.stale:
            print(f"  {mode}: allowed to fail but passed (the allowance is stale): ", end="")
            print(", ".join(found.stale))
        if found.regressions:
            status = EXIT_REGRESSION
            print(
                f"  FAIL: {mode} fails {len(found.regressions)} scenario run(s) that pass"
                " unguarded:"
            )
            for finding in found.regressions:
                print(f"    - {finding}")
    if status == EXIT_OK:
        print(f"  OK: every mode passes everything the unguarded server passes ({label})")
    summary: dict[str, object] = {
        "label": label,
        "scenarios": len(scenarios),
        "passes": passes,
        "passed_every_pass": counts,
        "regressions": {m: [str(f) for f in c.regressions] for m, c in comparisons.items()},
        "allowed": {m: [str(f) for f in c.allowed] for m, c in comparisons.items()},
        "stale_allowances": {m: c.stale for m, c in comparisons.items()},
        "unguarded_failures": [str(finding) for finding in bare_failures],
        "results": {
            mode: [
                {
                    name: {"passed": s.passed, "failures": s.failures, "warnings": s.warnings}
                    for name, s in sorted(r.items())
                }
                for r in runs[mode]
            ]
            for mode in modes
        },
    }
    return status, summary


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # run the `finally` blocks that stop the fixture servers


def _modes(value: str) -> tuple[str, ...]:
    named = [m.strip() for m in value.split(",") if m.strip()]
    unknown = sorted(set(named) - set(MODES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown mode(s) {', '.join(unknown)}; modes: {MODES}")
    return tuple(m for m in MODES if m == BASELINE or m in named)


def _names(value: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("name at least one scenario")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run the MCP conformance server suite against the fixture, unguarded, guarded"
        " by mcp-once, and behind mcp-once proxy (one upstream, and a gateway); arguments after"
        " -- go to `conformance server`."
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
    parser.add_argument(
        "--modes",
        type=_modes,
        default=MODES,
        help=f"comma-separated, {BASELINE} always included (default: {','.join(MODES)})",
    )
    parser.add_argument(
        "--scenarios",
        type=_names,
        default=(),
        help="comma-separated: run each with --scenario instead of a suite (extension scenarios)",
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
    runs: dict[str, list[PassResult]] = {mode: [] for mode in args.modes}
    try:
        for mode in args.modes:
            print(f"  {args.label}: {mode} server, {args.passes} pass(es)", flush=True)
            mode_dir = results_dir / mode
            mode_dir.mkdir(parents=True, exist_ok=True)
            with server(mode, mode_dir, start_timeout=60) as url:
                for index in range(1, args.passes + 1):
                    out = mode_dir / f"pass{index}"
                    result = run_pass(
                        node_command, url, args.suite_args, out, args.timeout, args.scenarios
                    )
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
