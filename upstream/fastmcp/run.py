"""Run FastMCP's own test suite without and with mcp-once's middleware on every server, and diff.

    cd /work/main/upstream/fastmcp && uv sync
    uv run python run.py --report /tmp/fastmcp_suite_report.md

1. The tests: FastMCP's sdist on PyPI carries its whole repository, tests/ included;
   `--source` (default /tmp/fastmcp-4.1.6) is filled from it with `pip download` if missing.
2. The unguarded run: the suite as released, run from the source folder with its own pytest
   configuration (markers, timeouts, pytest-env, filterwarnings), but against the installed
   fastmcp 4.1.6 wheel (`-o pythonpath=` drops the config's `fastmcp_slim/` source path; the
   wheel's files are the same). fastmcp-tasks and fastmcp-remote 4.1.6 are not on PyPI, so a
   `.pth` file in this environment puts the sdist's `fastmcp_tasks/` and `fastmcp_remote/` on the
   path of every interpreter here, as FastMCP's own config and editable installs do.
3. The guarded run: the same, with `MCP_ONCE_GUARD=1 -p guarded_plugin`, and with the `.pth`
   file also calling `mcp_once_guard.boot()`, so that servers built in child interpreters
   (stdio, `fastmcp run`, subprocess tests) get the middleware too. Every FastMCP server is
   built, then `server.add_middleware(IdempotencyMiddleware(MemoryKeyStore()))`.
4. Each run is done in FastMCP's CI phases: the unit tests in parallel (pytest-xdist), the
   `client_process`/`subprocess_heavy` tests serially, and the integration tests that need only
   loopback and a local redis-server. Left out: the `conformance` tests (they download the
   conformance runner from npm through npx) and the integration tests against GitHub and
   Keycloak (internet and secrets).
5. The tests that passed unguarded and failed (or errored) guarded are run again, alone, in both
   modes: a regression is "confirmed" when it passes unguarded and fails guarded again.

The report lists totals, wall times and every regression with the first line of its failure,
grouped by test file; it is printed and written to `--report`. The `.pth` file is left in its
unguarded form (paths only) whatever happens.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

FASTMCP_VERSION = "4.1.6"
PIN = f"fastmcp=={FASTMCP_VERSION}"
HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BOOT_DIR = HERE / "boot"
PTH_NAME = "_mcp_once_upstream.pth"
MODES = ("unguarded", "guarded")
FAILED = frozenset({"failed", "error"})

#: Left out of both runs: they need the internet, secrets or services not here.
EXCLUDED_MARKERS = ("conformance",)
EXCLUDED_REASONS = (
    "`-m conformance` (tests/conformance): runs `npx @modelcontextprotocol/conformance`, "
    "a download from npm",
    "tests/integration_tests/test_github_mcp_remote.py: GitHub's hosted MCP server, with a token",
    "tests/integration_tests/auth/: GitHub OAuth and a Keycloak server, with secrets",
)


@dataclasses.dataclass(frozen=True)
class Phase:
    """One pytest invocation of a run, as FastMCP's CI splits its suite."""

    name: str
    paths: tuple[str, ...]
    marker: str
    parallel: bool
    timeout: float


def phases(timeout: float, integration_timeout: float) -> tuple[Phase, ...]:
    excluded = " and ".join(f"not {m}" for m in EXCLUDED_MARKERS)
    return (
        Phase(
            "unit",
            ("tests",),
            f"not integration and not client_process and not subprocess_heavy and {excluded}",
            parallel=True,
            timeout=timeout,
        ),
        Phase(
            "serial",
            ("tests",),
            f"(client_process or subprocess_heavy) and not integration and {excluded}",
            parallel=False,
            timeout=timeout,
        ),
        Phase(
            "integration",
            (
                "tests/integration_tests/test_timeout_fix.py",
                "tests/integration_tests/test_task_credentials.py",
            ),
            f"integration and {excluded}",
            parallel=False,
            timeout=integration_timeout,
        ),
    )


@dataclasses.dataclass(frozen=True)
class Result:
    nodeid: str
    file: str
    outcome: str  # passed, failed, error, skipped, xfailed
    message: str  # first line of the failure, error or skip message
    phase: str = ""
    detail: str = ""  # for a failure: where in tests/ it failed, and a better line if any


@dataclasses.dataclass
class PhaseRun:
    phase: Phase
    junit: Path
    log: Path
    seconds: float
    exit_code: int


@dataclasses.dataclass
class ModeRun:
    mode: str
    phases: list[PhaseRun]
    results: dict[str, Result]

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)


# -- the source and the environment ----------------------------------------------------------


def ensure_source(source: Path) -> str:
    """The sdist's tree at `source`, downloaded with pip if missing; says where it came from."""
    if (source / "tests" / "conftest.py").is_file():
        return f"{source} (already there)"
    pip = shutil.which("pip") or shutil.which("pip3")
    if pip is None:
        raise SystemExit(f"{source} has no tests/ and no pip is on PATH to download the sdist")
    download = source.parent / f"fastmcp-{FASTMCP_VERSION}-sdist"
    download.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [pip, "download", "--no-deps", "--no-binary", ":all:", "-d", str(download), PIN],
        check=True,
    )
    archive = download / f"fastmcp-{FASTMCP_VERSION}.tar.gz"
    with tarfile.open(archive) as tar:
        tar.extractall(download, filter="data")
    (download / f"fastmcp-{FASTMCP_VERSION}").rename(source)
    if not (source / "tests" / "conftest.py").is_file():
        raise SystemExit(f"the sdist {archive} has no tests/conftest.py")
    return f"{source} (from {archive.name}, `pip download` of the PyPI sdist)"


def site_packages() -> Path:
    if sys.prefix == sys.base_prefix:
        raise SystemExit(
            "run this with the suite's own environment: cd upstream/fastmcp && uv run python run.py"
        )
    return Path(sysconfig.get_paths()["purelib"])


def write_pth(source: Path, guard_stats: Path | None) -> Path:
    """The `.pth` file: the sdist's extra packages on the path, and the guard if `guard_stats`."""
    lines = [str(source / "fastmcp_tasks"), str(source / "fastmcp_remote")]
    if guard_stats is not None:
        lines += [
            str(BOOT_DIR),
            f"import mcp_once_guard; mcp_once_guard.boot({str(guard_stats)!r})",
        ]
    path = site_packages() / PTH_NAME
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_env(mode: str, guard_stats: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_ONCE_GUARD")}
    env.pop("PYTHONPATH", None)
    env["PY_COLORS"] = "0"
    env["FASTMCP_CHECK_FOR_UPDATES"] = "off"
    if mode == "guarded":
        env["MCP_ONCE_GUARD"] = "1"
        env["MCP_ONCE_GUARD_STATS"] = str(guard_stats)
        env["PYTHONPATH"] = str(HERE)
    return env


def pytest_command(
    mode: str, phase: Phase, junit: Path, workers: int, targets: Sequence[str]
) -> list[str]:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    if mode == "guarded":
        command += ["-p", "guarded_plugin"]
    command += [
        "-o",
        "pythonpath=",
        "-o",
        "junit_family=xunit1",
        f"--junitxml={junit}",
        f"--timeout={phase.timeout:g}",
        "-m",
        phase.marker,
    ]
    if phase.parallel and workers > 1:
        command += ["-n", str(workers), "--dist", "worksteal"]
    else:
        command += ["-n", "0"]
    return [*command, *targets]


def run_phase(
    mode: str,
    phase: Phase,
    source: Path,
    work: Path,
    workers: int,
    stats: Path,
    label: str = "",
    targets: Sequence[str] | None = None,
) -> PhaseRun:
    stem = f"{label}{mode}-{phase.name}"
    junit = work / f"junit-{stem}.xml"
    log = work / f"{stem}.log"
    junit.unlink(missing_ok=True)
    if targets is None:
        targets = phase.paths
    else:  # test ids: pytest reads them, one a line, from @file
        args_file = work / f"{stem}.args"
        args_file.write_text("\n".join(targets) + "\n", encoding="utf-8")
        targets = [f"@{args_file}"]
    command = pytest_command(mode, phase, junit, workers, targets)
    print(f"[{now()}] {stem}: {' '.join(command[1:])}", flush=True)
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        out.write(" ".join(command) + "\n\n")
        out.flush()
        completed = subprocess.run(
            command,
            cwd=source,
            env=run_env(mode, stats),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    seconds = time.monotonic() - started
    print(
        f"[{now()}] {stem}: exit {completed.returncode} in {seconds:.0f}s; {tail(log)}",
        flush=True,
    )
    return PhaseRun(phase, junit, log, seconds, completed.returncode)


def run_mode(
    mode: str,
    all_phases: Sequence[Phase],
    source: Path,
    work: Path,
    workers: int,
    label: str = "",
    targets: dict[str, list[str]] | None = None,
) -> ModeRun:
    """Every phase of one run (or, with `targets`, those phases' given test ids only)."""
    stats = work / f"{label}guard-stats"
    shutil.rmtree(stats, ignore_errors=True)
    stats.mkdir(parents=True)
    write_pth(source, stats if mode == "guarded" else None)
    try:
        runs = [
            run_phase(
                mode,
                phase,
                source,
                work,
                workers,
                stats,
                label,
                None if targets is None else targets[phase.name],
            )
            for phase in all_phases
            if targets is None or targets.get(phase.name)
        ]
    finally:
        write_pth(source, None)
    return ModeRun(mode, runs, merge(parse_junit(r.junit, r.phase.name) for r in runs))


def now() -> str:
    return datetime.now(UTC).strftime("%H:%M:%S")


def tail(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    summary = [line for line in lines if line and (" in " in line and "passed" in line)]
    return summary[-1] if summary else (lines[-1] if lines else "(no output)")


# -- junit ------------------------------------------------------------------------------------


def first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def nodeid_of(case: ET.Element) -> tuple[str, str]:
    """(nodeid, file) of an xunit1 testcase: file::Class::...::name[params]."""
    name = case.get("name", "")
    classname = case.get("classname", "")
    file = case.get("file")
    if not file:  # a collection error: classname is the module's dotted path
        dotted = ".".join(p for p in (classname, name) if p)
        return dotted, dotted.replace(".", "/") + ".py"
    module = file.removesuffix(".py").replace("/", ".").replace("\\", ".")
    classes = classname[len(module) + 1 :] if classname.startswith(module + ".") else ""
    parts = [file, *(classes.split(".") if classes else []), name]
    return "::".join(parts), file


#: A message's first line that says little: the next exception line or the test's line helps.
_BARE = re.compile(
    r"^([\w.]+(Error|Exception|Exit)|Traceback \(most recent call last\):|Failed: .*)$"
)
_EXCEPTION_LINE = re.compile(r"^\s*[\w.]+(Error|Exception|Warning)\b.*\S")
_TEST_FRAME = re.compile(r"^(tests/[^\s:]+\.py):(\d+): ?(.*)$")


def where_in_tests(text: str) -> str:
    """The deepest frame of the traceback in FastMCP's tests: `tests/x.py:12` and its line."""
    lines = text.splitlines()
    found = ""
    for index, line in enumerate(lines):
        match = _TEST_FRAME.match(line)
        if not match:
            continue
        statement = ""
        for back in range(index - 1, max(index - 40, -1), -1):
            if lines[back].startswith(">"):
                statement = lines[back][1:].strip()
                break
        found = f"{match[1]}:{match[2]}" + (f" `{statement}`" if statement else "")
    return found


def outcome_of(case: ET.Element) -> tuple[str, str, str]:
    """(outcome, first line of its message, detail) of one testcase."""
    failure = case.find("failure")
    error = case.find("error")
    skipped = case.find("skipped")
    for element, outcome in ((failure, "failed"), (error, "error")):
        if element is not None:
            raw = element.get("message") or ""
            body = element.text or ""
            message = first_line(raw)
            if not message:
                e_lines = [x[1:].strip() for x in body.splitlines() if x.startswith("E ")]
                message = e_lines[0] if e_lines else first_line(body)
            details = []
            if _BARE.match(message):
                better = [x.strip() for x in raw.splitlines()[1:] if _EXCEPTION_LINE.match(x)]
                if better:
                    details.append(better[0][:300] + (" …" if len(better[0]) > 300 else ""))
            where = where_in_tests(body)
            if where:
                details.append(f"at {where}")
            return outcome, message, "; ".join(details)
    if skipped is not None:
        kind = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
        return kind, first_line(skipped.get("message")), ""
    return "passed", "", ""


def parse_junit(path: Path, phase: str) -> dict[str, Result]:
    results: dict[str, Result] = {}
    if not path.is_file():
        return results
    for case in ET.parse(path).getroot().iter("testcase"):
        nodeid, file = nodeid_of(case)
        outcome, message, detail = outcome_of(case)
        results[nodeid] = Result(nodeid, file, outcome, message, phase, detail)
    return results


def merge(parts: Iterable[dict[str, Result]]) -> dict[str, Result]:
    merged: dict[str, Result] = {}
    for part in parts:
        merged.update(part)
    return merged


# -- the diff and the report ------------------------------------------------------------------


@dataclasses.dataclass
class Rerun:
    """The regressions run again alone, some rounds of each mode."""

    unguarded: list[dict[str, Result]]
    guarded: list[dict[str, Result]]

    def verdict(self, nodeid: str) -> str:
        before = [r[nodeid] for r in self.unguarded if nodeid in r]
        after = [r[nodeid] for r in self.guarded if nodeid in r]
        if not before or not after:
            return "not rerun"
        passed = sum(1 for r in before if r.outcome == "passed")
        failed = sum(1 for r in after if r.outcome in FAILED)
        if passed == len(before) and failed == len(after):
            return f"confirmed: failed {failed}/{len(after)} guarded reruns"
        note = (
            f"guarded reruns failed {failed}/{len(after)}, unguarded passed {passed}/{len(before)}"
        )
        odd = [r for r in before if r.outcome != "passed"]
        if odd:
            note += f" (unguarded rerun: {odd[0].outcome}: {odd[0].message})"
        return note


def regressions(unguarded: ModeRun, guarded: ModeRun) -> list[Result]:
    return [
        after
        for nodeid, after in guarded.results.items()
        if after.outcome in FAILED
        and (before := unguarded.results.get(nodeid)) is not None
        and before.outcome == "passed"
    ]


def rerun(
    found: Sequence[Result],
    all_phases: Sequence[Phase],
    source: Path,
    work: Path,
    workers: int,
    rounds: int,
) -> Rerun:
    """Run the regressions again, alone, `rounds` times in each mode, as in their phase."""
    by_phase: dict[str, list[str]] = defaultdict(list)
    for result in found:
        by_phase[result.phase].append(result.nodeid)
    results: dict[str, list[dict[str, Result]]] = {mode: [] for mode in MODES}
    for n in range(1, rounds + 1):
        for mode in MODES:
            run = run_mode(mode, all_phases, source, work, workers, f"rerun{n}-", by_phase)
            results[mode].append(run.results)
    return Rerun(results["unguarded"], results["guarded"])


def code_digest() -> str:
    """A digest of mcp-once's working tree (idempotency/), to see whether it moved mid-run."""
    digest = hashlib.sha256()
    for path in sorted((REPO / "idempotency").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def totals(run: ModeRun) -> Counter[str]:
    return Counter(r.outcome for r in run.results.values())


def guard_stats(stats: Path) -> tuple[int, int, int, int]:
    """(servers guarded, in how many processes, servers in child interpreters, how many)."""
    servers = processes = child_servers = children = 0
    for path in stats.glob("*.count"):
        count, role, *_ = path.read_text(encoding="utf-8").split()
        servers += int(count)
        processes += 1
        if role == "child":
            child_servers += int(count)
            children += 1
    return servers, processes, child_servers, children


def git(*args: str) -> str:
    completed = subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=False
    )
    return completed.stdout.strip()


def md_code(text: str, limit: int = 600) -> str:
    text = text.replace("`", "'")
    if len(text) > limit:
        text = text[:limit] + " …"
    return f"`{text}`" if text else "(no message)"


def grouped(results: Iterable[Result]) -> dict[str, list[Result]]:
    groups: dict[str, list[Result]] = defaultdict(list)
    for result in results:
        groups[result.file].append(result)
    return {file: sorted(groups[file], key=lambda r: r.nodeid) for file in sorted(groups)}


def listing(results: Sequence[Result], verdicts: Rerun | None = None) -> list[str]:
    lines: list[str] = []
    for file, items in grouped(results).items():
        lines += ["", f"### {file} ({len(items)})", ""]
        for r in items:
            detail = f" ({r.detail})" if r.detail else ""
            note = f" — _{verdicts.verdict(r.nodeid)}_" if verdicts is not None else ""
            lines.append(f"- `{r.nodeid}` [{r.outcome}]: {md_code(r.message)}{detail}{note}")
    return lines


def report(
    runs: dict[str, ModeRun],
    found: Sequence[Result],
    verdicts: Rerun | None,
    source_note: str,
    work: Path,
    argv: Sequence[str],
    info: dict[str, Any],
) -> str:
    unguarded, guarded = runs["unguarded"], runs["guarded"]
    code: dict[str, str] = info.get("code", {})
    moved = len(set(code.values())) > 1
    lines = [
        f"# FastMCP {FASTMCP_VERSION}'s test suite, without and with mcp-once's middleware",
        "",
        f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- mcp-once: the working tree at {REPO} (editable), HEAD {info.get('commit', '?')}; "
        f"its uncommitted changes to idempotency/ when each run started are in "
        f"{work}/idempotency-<run>.diff. Digest of idempotency/: "
        + ", ".join(f"{k} {v}" for k, v in code.items())
        + (" — **the code changed during the runs**" if moved else " (unchanged throughout)"),
        f"- fastmcp {installed('fastmcp')}, fastmcp-slim {installed('fastmcp-slim')}, "
        f"mcp {installed('mcp')}, pytest {installed('pytest')}, "
        f"Python {sys.version.split()[0]}",
        f"- Tests: {source_note}",
        "- Guarded: every `FastMCP(...)` is followed by "
        "`add_middleware(IdempotencyMiddleware(MemoryKeyStore()))` (in pytest's processes "
        "and in child interpreters)",
        f"- Command: `{' '.join(['python', 'run.py', *argv])}`; logs and junit files in {work}",
        "- Left out of both runs: " + "; ".join(EXCLUDED_REASONS),
        "",
        "## Totals",
        "",
        "| run | wall time | tests | passed | failed | errors | skipped | xfailed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in (unguarded, guarded):
        t = totals(run)
        phase_times = ", ".join(f"{p.phase.name} {p.seconds:.0f}s" for p in run.phases)
        lines.append(
            f"| {run.mode} | {run.seconds:.0f}s ({phase_times}) | {sum(t.values())} "
            f"| {t['passed']} | {t['failed']} | {t['error']} | {t['skipped']} | {t['xfailed']} |"
        )
    servers, processes, child_servers, children = guard_stats(work / "guard-stats")
    lines += [
        "",
        f"Guard check (guarded run): {servers} servers got the middleware, in {processes} "
        f"processes; {child_servers} of them in {children} child interpreters (not pytest's).",
        "",
        f"## Passed unguarded, failed guarded: {len(found)} tests in {len(grouped(found))} files",
    ]
    if verdicts is not None:
        confirmed = sum(1 for r in found if verdicts.verdict(r.nodeid).startswith("confirmed"))
        lines += [
            "",
            f"Each was run again alone, {len(verdicts.guarded)} times in each mode: "
            f"{confirmed} confirmed (passed every unguarded rerun, failed every guarded one); "
            "the others' notes say what the reruns found. Each line: the test id, the first "
            "line of its failure in the full guarded run, then (in parentheses) a more telling "
            "exception line where the first says little, and the deepest line of FastMCP's "
            "tests in the traceback.",
        ]
    lines += listing(found, verdicts)

    ids_before, ids_after = set(unguarded.results), set(guarded.results)
    only_unguarded = [unguarded.results[i] for i in sorted(ids_before - ids_after)]
    only_guarded = [guarded.results[i] for i in sorted(ids_after - ids_before)]
    skipped_guarded = [
        guarded.results[i]
        for i in sorted(ids_before & ids_after)
        if unguarded.results[i].outcome == "passed"
        and guarded.results[i].outcome in {"skipped", "xfailed"}
    ]
    fixed = [
        guarded.results[i]
        for i in sorted(ids_before & ids_after)
        if unguarded.results[i].outcome in FAILED and guarded.results[i].outcome == "passed"
    ]
    both = [
        unguarded.results[i]
        for i in sorted(ids_before & ids_after)
        if unguarded.results[i].outcome in FAILED and guarded.results[i].outcome in FAILED
    ]
    baseline = [r for r in unguarded.results.values() if r.outcome in FAILED]
    lines += [
        "",
        f"## Passed unguarded, skipped guarded: {len(skipped_guarded)}",
        *listing(skipped_guarded),
        "",
        f"## In the unguarded run only: {len(only_unguarded)}",
        *listing(only_unguarded),
        "",
        f"## In the guarded run only: {len(only_guarded)}",
        *listing(only_guarded),
        "",
        f"## Failed unguarded, passed guarded (flaky, or environment): {len(fixed)}",
        *listing(fixed),
        "",
        f"## Failed in the unguarded run (the baseline here): {len(baseline)}, "
        f"{len(both)} of them failing guarded too",
        *listing(baseline),
        "",
    ]
    return "\n".join(lines)


def installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--source", type=Path, default=Path(f"/tmp/fastmcp-{FASTMCP_VERSION}"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/fastmcp-suite"))
    parser.add_argument("--report", type=Path, default=Path("/tmp/fastmcp_suite_report.md"))
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (unit)")
    parser.add_argument("--timeout", type=float, default=5, help="per test (FastMCP CI: 5)")
    parser.add_argument(
        "--integration-timeout", type=float, default=30, help="per test (FastMCP CI: 30)"
    )
    parser.add_argument(
        "--reuse", action="store_true", help="no runs: report from the junit files in --work"
    )
    parser.add_argument(
        "--rerun-rounds",
        type=int,
        default=3,
        help="run the regressions again alone this many times in each mode (0: not at all)",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="PATH",
        help="run only these test paths (relative to --source; repeatable), for a quick check",
    )
    args = parser.parse_args(args_list)

    source: Path = args.source.resolve()
    work: Path = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    source_note = ensure_source(source)
    if installed("fastmcp") != FASTMCP_VERSION:
        print(f"warning: fastmcp {installed('fastmcp')} is installed, not {FASTMCP_VERSION}")
    all_phases = phases(args.timeout, args.integration_timeout)
    if args.only:
        all_phases = tuple(dataclasses.replace(p, paths=tuple(args.only)) for p in all_phases)

    summary = work / "run.json"
    runs: dict[str, ModeRun] = {}
    if args.reuse:
        info: dict[str, Any] = json.loads(summary.read_text()) if summary.is_file() else {}
        times: dict[str, float] = info.get("times", {})
        for mode in MODES:
            parsed = [
                PhaseRun(
                    p,
                    work / f"junit-{mode}-{p.name}.xml",
                    work / f"{mode}-{p.name}.log",
                    times.get(f"{mode}-{p.name}", 0.0),
                    0,
                )
                for p in all_phases
            ]
            results = merge(parse_junit(r.junit, r.phase.name) for r in parsed)
            runs[mode] = ModeRun(mode, parsed, results)
    else:
        info = {"commit": git("rev-parse", "--short", "HEAD"), "code": {}}
        for mode in MODES:
            info["code"][f"{mode} start"] = code_digest()
            diff = git("diff", "HEAD", "--", "idempotency")
            (work / f"idempotency-{mode}.diff").write_text(diff + "\n", encoding="utf-8")
            runs[mode] = run_mode(mode, all_phases, source, work, args.workers)
            info["code"][f"{mode} end"] = code_digest()
        info["times"] = {
            f"{m}-{p.phase.name}": p.seconds for m, r in runs.items() for p in r.phases
        }
        summary.write_text(json.dumps(info, indent=1), encoding="utf-8")

    found = regressions(runs["unguarded"], runs["guarded"])
    verdicts = None
    if found and args.reuse:
        rounds = sorted(
            {
                int(m[1])
                for f in work.glob("junit-rerun*-*.xml")
                if (m := re.match(r"junit-rerun(\d+)-", f.name))
            }
        )
        reruns = {
            mode: [
                merge(
                    parse_junit(work / f"junit-rerun{n}-{mode}-{p.name}.xml", p.name)
                    for p in all_phases
                )
                for n in rounds
            ]
            for mode in MODES
        }
        if rounds:
            verdicts = Rerun(reruns["unguarded"], reruns["guarded"])
    elif found and args.rerun_rounds > 0:
        verdicts = rerun(found, all_phases, source, work, args.workers, args.rerun_rounds)
    text = report(runs, found, verdicts, source_note, work, args_list, info)
    args.report.write_text(text, encoding="utf-8")
    print(text)
    print(f"\nreport: {args.report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
