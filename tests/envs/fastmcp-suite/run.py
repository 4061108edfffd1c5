"""Run FastMCP's own test suite without and with mcp-once's middleware on every server, and diff.

    cd tests/envs/fastmcp-suite && uv sync
    uv run python run.py --report /tmp/fastmcp_suite_report.md
    uv run python run.py --expect expected.toml     # the CI gate (.ci/fastmcp-suite)

1. The tests: FastMCP's sdist on PyPI carries its whole repository, tests/ included;
   `--source` (default /tmp/fastmcp-4.1.6) is filled from it with `pip download` (uv's
   `uvx pip` first: this environment has no pip) if missing, and the archive's sha256 checked.
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
   `client_process`/`subprocess_heavy` tests serially (one xdist worker), and the integration
   tests that need only loopback and a local redis-server. FastMCP's timeouts apply (5 s, 30 s);
   a test that outlives its timeout by far (its `Failed` swallowed by some asyncio task) has its
   worker ended by `watchdog_plugin.py`, which records it as hung, with every thread's stack.
   Left out: the `conformance` tests (they download the conformance runner from npm through
   npx) and the integration tests against GitHub and Keycloak (internet and secrets).
5. The tests that passed unguarded and failed (or errored) guarded are run again, alone,
   `--rerun-rounds` times in each mode: a regression is "confirmed" when it passed every
   unguarded rerun and failed every guarded one.
   With `--baseline failures` (what CI uses) the guarded run goes first and only its failures
   are run unguarded: a test that passes guarded needs no baseline, and the gate costs one full
   run instead of two (~10 minutes less on 2 cores). That the guarded run left no test out is
   then checked against an unguarded `--collect-only` of every phase.
6. The middleware under test is mcp-once's working tree, copied (its `idempotency/`) when the
   run starts, and imported from that copy by every guarded process: the working tree may move
   during a run (someone committing) without mixing versions. `--no-snapshot` imports it live.
7. With `--expect FILE` (`--gate`: expected.toml here) the run is a gate: it exits 1 when a
   regression the reruns confirmed is not in FILE (each entry: test id, category, reason), when
   a test that passed unguarded is missing from the guarded run, when a phase left no results
   or pytest ended it abnormally, when the guard guarded nothing, or when the unguarded run
   fails more than `--max-baseline-failures` tests. It warns (exit 0) about expected entries
   that no longer regress, unlisted regressions the reruns did not confirm, and tests failing
   in both runs (the environment's). A malformed FILE is refused before any run (exit 2).

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
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
import tomllib
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

FASTMCP_VERSION = "4.1.6"
PIN = f"fastmcp=={FASTMCP_VERSION}"
#: sha256 of fastmcp-4.1.6.tar.gz, the sdist on PyPI (whose files never change).
SDIST_SHA256 = "5e307ae4ac3048a1b586aac6fc31e08661141bb69b8a2b473070e5becae0176c"
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
BOOT_DIR = HERE / "boot"
DEFAULT_EXPECT = HERE / "expected.toml"
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

    @property
    def hard_timeout(self) -> float:
        """When watchdog_plugin ends a worker whose test pytest-timeout did not stop."""
        return self.timeout * 4 + 30


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
    exit_code: int | None  # None: not known (--reuse of a run that did not record it)


@dataclasses.dataclass
class ModeRun:
    mode: str
    phases: list[PhaseRun]
    results: dict[str, Result]

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)


# -- the source and the environment ----------------------------------------------------------


def pip_commands() -> list[tuple[str, list[str]]]:
    """The ways to run pip found here, best first, each as (label, command).

    uv first (`uv tool run pip`, i.e. `uvx pip`: pip from PyPI, in uv's cache), since uv is what
    this environment needs anyway and its own environment has no pip; then a pip on PATH; then
    the system Python's `python3 -m pip`.
    """
    found: list[tuple[str, list[str]]] = []
    uv = os.environ.get("UV") or shutil.which("uv")  # `uv run` names itself in $UV
    if uv:
        found.append(("uvx pip", [uv, "tool", "run", "pip"]))
    pip = shutil.which("pip") or shutil.which("pip3")
    if pip:
        found.append((pip, [pip]))
    python3 = shutil.which("python3")
    if python3 and python3 != sys.executable:
        found.append((f"{python3} -m pip", [python3, "-m", "pip"]))
    return found


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_source(source: Path) -> str:
    """The sdist's tree at `source`, downloaded with pip if missing; says where it came from.

    `pip download --no-deps --no-binary fastmcp fastmcp==4.1.6`, through the first of
    `pip_commands()` that succeeds; the archive must have the sha256 PyPI lists for it.
    """
    if (source / "tests" / "conftest.py").is_file():
        return f"{source} (already there)"
    if source.exists() and any(source.iterdir()):
        raise SystemExit(
            f"{source} exists but has no tests/conftest.py: remove it, or pick another"
        )
    download = source.parent / f"fastmcp-{FASTMCP_VERSION}-sdist"
    download.mkdir(parents=True, exist_ok=True)
    archive = download / f"fastmcp-{FASTMCP_VERSION}.tar.gz"
    arguments = ["download", "--no-deps", "--no-binary", "fastmcp", "-d", str(download), PIN]
    used = ""
    for label, command in pip_commands():
        print(f"[{now()}] {source} is missing: {label} {' '.join(arguments)}", flush=True)
        if subprocess.run([*command, *arguments], check=False).returncode == 0:
            used = label
            break
    if not used or not archive.is_file():
        tried = ", ".join(label for label, _ in pip_commands()) or "no uv, pip or python3 found"
        raise SystemExit(f"could not download the {PIN} sdist to {download} (tried: {tried})")
    digest = sha256_of(archive)
    if digest != SDIST_SHA256:
        raise SystemExit(f"{archive} has sha256 {digest}, not PyPI's {SDIST_SHA256}")
    with tarfile.open(archive) as tar:
        tar.extractall(download, filter="data")
    if source.exists():
        source.rmdir()  # empty (checked above)
    (download / f"fastmcp-{FASTMCP_VERSION}").rename(source)
    if not (source / "tests" / "conftest.py").is_file():
        raise SystemExit(f"the sdist {archive} has no tests/conftest.py")
    return f"{source} (from {archive.name}, sha256 {digest[:12]}, downloaded with {used})"


def site_packages() -> Path:
    if sys.prefix == sys.base_prefix:
        raise SystemExit(
            "run this with the suite's own environment:"
            " cd tests/envs/fastmcp-suite && uv run python run.py"
        )
    return Path(sysconfig.get_paths()["purelib"])


def write_pth(source: Path, guard_stats: Path | None, snapshot: Path | None = None) -> Path:
    """The `.pth` file: the sdist's extra packages on the path, and the guard if `guard_stats`.

    With `snapshot`, the guard's processes import mcp-once's `idempotency` from there.
    """
    lines = [str(source / "fastmcp_tasks"), str(source / "fastmcp_remote")]
    if guard_stats is not None:
        where = repr(str(snapshot)) if snapshot is not None else "None"
        lines += [
            str(BOOT_DIR),
            f"import mcp_once_guard; mcp_once_guard.boot({str(guard_stats)!r}, {where})",
        ]
    path = site_packages() / PTH_NAME
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_env(mode: str, phase: Phase, guard_stats: Path, watchdog: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_ONCE_")}
    env["PYTHONPATH"] = str(HERE)  # the plugins
    env["PY_COLORS"] = "0"
    env["FASTMCP_CHECK_FOR_UPDATES"] = "off"
    env["MCP_ONCE_HARD_TIMEOUT"] = f"{phase.hard_timeout:g}"
    env["MCP_ONCE_WATCHDOG_DIR"] = str(watchdog)
    if mode == "guarded":
        env["MCP_ONCE_GUARD"] = "1"
        env["MCP_ONCE_GUARD_STATS"] = str(guard_stats)
    return env


def pytest_command(
    mode: str, phase: Phase, junit: Path, workers: int, targets: Sequence[str]
) -> list[str]:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    command += ["-p", "watchdog_plugin"]
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
    # Always under xdist, so that watchdog_plugin can end a hung test's worker: the serial
    # phases run in one worker.
    if phase.parallel and workers > 1:
        command += ["-n", str(workers), "--dist", "worksteal"]
    else:
        command += ["-n", "1"]
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
            env=run_env(mode, phase, stats, work / f"{stem}.watchdog"),
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
    snapshot: Path | None,
    label: str = "",
    targets: dict[str, list[str]] | None = None,
) -> ModeRun:
    """Every phase of one run (or, with `targets`, those phases' given test ids only)."""
    stats = work / f"{label}guard-stats"
    if mode == "guarded":  # an unguarded run after it (--baseline failures) keeps its stats
        shutil.rmtree(stats, ignore_errors=True)
        stats.mkdir(parents=True)
    write_pth(source, stats if mode == "guarded" else None, snapshot)
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
    return ModeRun(mode, runs, results_of(runs, work, label, mode))


def stored_runs(
    work: Path,
    label: str,
    mode: str,
    all_phases: Sequence[Phase],
    times: dict[str, float],
    exit_codes: dict[str, int] | None = None,
) -> list[PhaseRun]:
    """The phase runs that an earlier `run.py` left in `work` (for `--reuse`)."""
    codes = exit_codes or {}
    return [
        PhaseRun(
            p,
            work / f"junit-{label}{mode}-{p.name}.xml",
            work / f"{label}{mode}-{p.name}.log",
            times.get(f"{label}{mode}-{p.name}", 0.0),
            codes.get(f"{label}{mode}-{p.name}"),
        )
        for p in all_phases
    ]


def results_of(runs: Sequence[PhaseRun], work: Path, label: str, mode: str) -> dict[str, Result]:
    """The phases' junit results, each hung test noted as the watchdog saw it."""
    results = merge(parse_junit(r.junit, r.phase.name) for r in runs)
    for run in runs:
        folder = work / f"{label}{mode}-{run.phase.name}.watchdog"
        for path in sorted(folder.glob("*.txt")):
            nodeid, seconds, *_ = path.read_text(encoding="utf-8", errors="replace").split("\n")
            if nodeid in results:
                note = (
                    f"hung: still running {seconds}s after it started, past pytest-timeout; "
                    f"the harness ended its worker (threads' stacks: {path})"
                )
                results[nodeid] = dataclasses.replace(results[nodeid], detail=note)
    return results


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
    r"^([\w.]+(Error|Exception|Exit)|(.*: )?Traceback \(most recent call last\):|Failed: .*)$"
)
_EXCEPTION_LINE = re.compile(r"^\s*[\w.]+(Error|Exception|Warning)\b.*\S")
_TEST_FRAME = re.compile(r"^(tests/[^\s:]+\.py):(\d+): ?(.*)$")


def where_in_tests(text: str) -> str:
    """The deepest frame of the traceback in FastMCP's tests: `tests/x.py:12` and its line.

    pytest prints a frame in long style (its source, the failing line marked `>`, then
    `path:line: Exception`) or in short style (`path:line: in function`, then the line).
    """
    lines = text.splitlines()
    found = ""
    for index, line in enumerate(lines):
        match = _TEST_FRAME.match(line)
        if not match:
            continue
        statement = ""
        if match[3].startswith("in ") and index + 1 < len(lines):
            statement = lines[index + 1].strip()
        else:
            for back in range(index - 1, -1, -1):
                if lines[back].startswith("_ _ _") or _TEST_FRAME.match(lines[back]):
                    break
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

    def confirmed(self, nodeid: str) -> bool | None:
        """Whether it passed every unguarded rerun and failed every guarded one (None: not
        rerun)."""
        before = [r[nodeid] for r in self.unguarded if nodeid in r]
        after = [r[nodeid] for r in self.guarded if nodeid in r]
        if not before or not after:
            return None
        return all(r.outcome == "passed" for r in before) and all(
            r.outcome in FAILED for r in after
        )

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


def ids_by_phase(results: Iterable[Result]) -> dict[str, list[str]]:
    """The results' test ids, by the phase they ran in (what `run_mode(targets=...)` takes)."""
    by_phase: dict[str, list[str]] = defaultdict(list)
    for result in results:
        by_phase[result.phase].append(result.nodeid)
    return by_phase


def collected_ids(all_phases: Sequence[Phase], source: Path, work: Path) -> set[str]:
    """Every test id an unguarded run of the phases would run (`pytest --collect-only`), for
    `--baseline failures`: the guarded run must hold each of them."""
    write_pth(source, None)
    ids: set[str] = set()
    # One collection per set of paths (the unit and serial phases share `tests`: collecting 10,000
    # tests costs ~30 s a time here), selecting what any of those phases selects.
    by_paths: dict[tuple[str, ...], list[Phase]] = defaultdict(list)
    for phase in all_phases:
        by_paths[phase.paths].append(phase)
    for paths, sharing in by_paths.items():
        marker = " or ".join(f"({p.marker})" for p in sharing)
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only"]
        command += ["-q", "-o", "pythonpath=", "-m", marker, *paths]
        env = run_env("unguarded", sharing[0], work / "collect-stats", work / "collect.watchdog")
        done = subprocess.run(
            command, cwd=source, env=env, capture_output=True, text=True, check=False
        )
        if done.returncode not in (0, 5):
            raise SystemExit(
                f"collect-only of {' '.join(paths)} exited {done.returncode}:\n"
                + done.stdout[-3000:]
                + done.stderr[-3000:]
            )
        ids.update(line for line in done.stdout.splitlines() if "::" in line)
    return ids


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
    snapshot: Path | None,
    rounds: int,
) -> Rerun:
    """Run the regressions again, alone, `rounds` times in each mode, as in their phase."""
    by_phase = ids_by_phase(found)
    results: dict[str, list[dict[str, Result]]] = {mode: [] for mode in MODES}
    for n in range(1, rounds + 1):
        for mode in MODES:
            label = f"rerun{n}-"
            run = run_mode(mode, all_phases, source, work, workers, snapshot, label, by_phase)
            results[mode].append(run.results)
    return Rerun(results["unguarded"], results["guarded"])


# -- the gate: the regressions against the expected list --------------------------------------

#: The kinds of expected difference: behaviours mcp-once documents on purpose.
CATEGORIES = {
    "marker": "results, and guarded tools' listings, carry mcp-once's `_meta` entry",
    "cache-order": "a response cache before the guard is refused; one inside it sees only what "
    "the guard lets through",
    "result-size": "a result over `max_result_bytes` is not kept; the key's retry gets the "
    "explanatory error",
    "drain": "a keyed execution runs to completion (rule 10), so a client leaving under a "
    "cancelled scope waits for it",
}
EXPECT_KEYS = frozenset({"id", "category", "reason", "intermittent"})


@dataclasses.dataclass(frozen=True)
class Expected:
    nodeid: str
    category: str
    reason: str
    intermittent: bool = False


def load_expected(path: Path) -> dict[str, Expected]:
    """The expected regressions: TOML `[[test]]` tables (or JSON `{"test": [...]}`), each with
    `id`, `category` (one of CATEGORIES), a one-line `reason` and optionally `intermittent`.
    Raises ValueError, naming every problem."""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
    entries = data.get("test") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: no [[test]] entries")
    expected: dict[str, Expected] = {}
    problems: list[str] = []
    for number, entry in enumerate(entries, 1):
        where = f"[[test]] #{number}"
        if not isinstance(entry, dict):
            problems.append(f"{where}: not a table")
            continue
        nodeid, category, reason = entry.get("id"), entry.get("category"), entry.get("reason")
        intermittent = entry.get("intermittent", False)
        if not isinstance(nodeid, str) or "::" not in nodeid:
            problems.append(f"{where}: `id` must be a pytest node id (file.py::test)")
            continue
        where = f"{where} ({nodeid})"
        if unknown := sorted(set(entry) - EXPECT_KEYS):
            problems.append(f"{where}: unknown keys {', '.join(unknown)}")
        if category not in CATEGORIES:
            problems.append(f"{where}: category {category!r} is not one of {', '.join(CATEGORIES)}")
        if not isinstance(reason, str) or not reason.strip() or "\n" in reason:
            problems.append(f"{where}: `reason` must be one non-empty line")
        if not isinstance(intermittent, bool):
            problems.append(f"{where}: `intermittent` must be true or false")
        if nodeid in expected:
            problems.append(f"{where}: listed twice")
        expected[nodeid] = Expected(nodeid, str(category), str(reason), intermittent is True)
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return expected


@dataclasses.dataclass
class Gate:
    """The verdict of `--expect`: it fails on `failures`; `warnings` and `notes` are reported."""

    path: Path
    expected: dict[str, Expected]
    failures: list[tuple[str, list[str]]] = dataclasses.field(default_factory=list)
    warnings: list[tuple[str, list[str]]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def fail(self, title: str, items: Sequence[str]) -> None:
        if items:
            self.failures.append((f"{title}: {len(items)}", list(items)))

    def warn(self, title: str, items: Sequence[str]) -> None:
        if items:
            self.warnings.append((f"{title}: {len(items)}", list(items)))

    def lines(self, bullet: str = "  - ", limit: int = 40) -> list[str]:
        """The verdict as text: each failing check and warning with (up to `limit` of) its
        tests, the notes, and a last line saying PASSED or FAILED."""

        def section(head: str, items: list[str]) -> list[str]:
            shown = [bullet + item for item in items[:limit]]
            if len(items) > limit:
                shown.append(f"{bullet}... and {len(items) - limit} more (see the report)")
            return [head, *shown]

        out = [f"gate: {len(self.expected)} expected regressions listed in {self.path}"]
        for title, items in self.failures:
            out += section(f"FAIL: {title}", items)
        for title, items in self.warnings:
            out += section(f"warning: {title}", items)
        out += [f"ok: {note}" for note in self.notes]
        verdict = "PASSED" if self.passed else "FAILED"
        out.append(
            f"gate: {verdict} ({len(self.failures)} failing checks, {len(self.warnings)} warnings)"
        )
        return out


def phase_checks(
    runs: dict[str, ModeRun],
    work: Path,
    partial: bool,
    snapshot: str | None,
    collected: set[str] | None = None,
) -> list[str]:
    """Why the runs cannot be judged, if they cannot: a phase without results or that pytest
    ended abnormally, a run without tests, a guarded run that guarded nothing, or that imported
    mcp-once from somewhere other than the snapshot."""
    broken: list[str] = []
    allowed = {0, 1, 5} if partial else {0, 1}  # 1: tests failed; 5: none collected (--only)
    for run in runs.values():
        for phase_run in run.phases:
            label = f"{run.mode} {phase_run.phase.name}"
            if not phase_run.junit.is_file():
                broken.append(f"{label}: no junit file ({phase_run.junit}); see {phase_run.log}")
            if phase_run.exit_code is not None and phase_run.exit_code not in allowed:
                broken.append(f"{label}: pytest exited {phase_run.exit_code}; see {phase_run.log}")
        if not run.results and not (collected is not None and run.mode == "unguarded"):
            broken.append(f"{run.mode}: no test results at all")
    if runs["guarded"].results:
        servers, _, _, _, sources = guard_stats(work / "guard-stats")
        if servers == 0:
            broken.append("guarded: no server got the middleware (the guard was not on)")
        if snapshot:
            others = sorted(s for s in sources if s != str(Path(snapshot) / "idempotency"))
            if others:
                broken.append(
                    f"guarded: `idempotency` imported from {', '.join(others)}, "
                    f"not from the snapshot {snapshot}"
                )
    return broken


def judge(
    runs: dict[str, ModeRun],
    found: Sequence[Result],
    verdicts: Rerun | None,
    expected: dict[str, Expected],
    path: Path,
    work: Path,
    partial: bool,
    snapshot: str | None,
    max_baseline_failures: int,
    collected: set[str] | None = None,
) -> Gate:
    """Hold the runs against the expected list.

    Fails on: a regression (passed unguarded, failed guarded) that is not expected and that the
    reruns confirmed (or that was not rerun, so could not be found flaky); a test that passed
    unguarded and is missing from the guarded run; runs that cannot be judged (phase_checks); a
    baseline with more than `max_baseline_failures` failures (the environment is broken, and
    would hide regressions). Warns about: unexpected regressions the reruns did not confirm,
    expected entries that no longer regress (or were not run), tests failing in both runs (the
    environment's), tests that failed only unguarded or were skipped only guarded.

    With `collected` (`--baseline failures`: the unguarded run holds only the guarded run's
    failures), a test is missing when the unguarded collection has it and the guarded run does
    not."""
    gate = Gate(path, expected)
    unguarded, guarded = runs["unguarded"].results, runs["guarded"].results
    gate.fail("the runs cannot be judged", phase_checks(runs, work, partial, snapshot, collected))
    baseline = sorted(i for i, r in unguarded.items() if r.outcome in FAILED)
    if len(baseline) > max_baseline_failures:
        gate.fail(
            f"the unguarded run failed more than {max_baseline_failures} tests (the environment "
            "is broken; the comparison would hide regressions)",
            [f"{len(baseline)} tests failed without the middleware; first: {baseline[0]}"],
        )

    def line(result: Result, note: str = "") -> str:
        text = f"{result.nodeid}: {md_code(result.message, 200).strip('`')}"
        return text + (f" ({note})" if note else "")

    confirmed_new, unconfirmed_new, unrerun_new = [], [], []
    seen: Counter[str] = Counter()
    intermittent_seen = 0
    for result in sorted(found, key=lambda r: r.nodeid):
        status = verdicts.confirmed(result.nodeid) if verdicts is not None else None
        note = verdicts.verdict(result.nodeid) if verdicts is not None else "not rerun"
        if result.nodeid in expected:
            seen[expected[result.nodeid].category] += 1
            intermittent_seen += status is not True
        elif status is True:
            confirmed_new.append(line(result, note))
        elif status is None:
            unrerun_new.append(line(result, note))
        else:
            unconfirmed_new.append(line(result, note))
    gate.fail(
        "confirmed regressions (pass unguarded, fail guarded) not in the expected list",
        confirmed_new,
    )
    gate.fail(
        "regressions not in the expected list and not rerun (so not known to be flaky)", unrerun_new
    )
    if collected is None:
        missing = sorted(
            i for i, r in unguarded.items() if r.outcome == "passed" and i not in guarded
        )
    else:
        missing = sorted(i for i in collected if i not in guarded)
    gate.fail(
        "passed unguarded, absent from the guarded run, not expected",
        [i for i in missing if i not in expected],
    )
    gate.warn(
        "regressions not in the expected list that the reruns did not confirm (intermittent)",
        unconfirmed_new,
    )

    regressed = {r.nodeid for r in found}
    stale, not_run, settled_intermittent = [], [], []
    for nodeid, entry in sorted(expected.items()):
        if nodeid in regressed or nodeid in missing:
            continue
        before, after = unguarded.get(nodeid), guarded.get(nodeid)
        if before is None and after is None:
            if not partial:
                not_run.append(f"{nodeid} [{entry.category}]")
        elif before is not None and before.outcome in FAILED:
            continue  # failed unguarded: listed with the environment's failures below
        elif entry.intermittent:
            outcome = after.outcome if after is not None else "absent"
            settled_intermittent.append(f"{nodeid} [{entry.category}]: {outcome} guarded")
        else:
            outcome = after.outcome if after is not None else "absent"
            stale.append(f"{nodeid} [{entry.category}]: {outcome} guarded")
    gate.warn(f"expected entries that no longer regress (prune them from {path.name})", stale)
    gate.warn(
        f"expected entries in neither run (renamed or removed? prune them from {path.name})",
        not_run,
    )

    both = [line(unguarded[i]) for i in baseline if guarded.get(i, unguarded[i]).outcome in FAILED]
    gate.warn("failed in both runs (the environment's, not mcp-once's)", both)
    gate.warn(
        "failed unguarded, passed guarded (flaky, or the environment)",
        [i for i in baseline if i in guarded and guarded[i].outcome == "passed"],
    )
    gate.warn(
        "passed unguarded, skipped guarded",
        sorted(
            i
            for i, r in unguarded.items()
            if r.outcome == "passed"
            and i in guarded
            and guarded[i].outcome in {"skipped", "xfailed"}
        ),
    )
    gate.warn(
        "failed in the guarded run only (not in the unguarded run)",
        sorted(i for i, r in guarded.items() if r.outcome in FAILED and i not in unguarded),
    )
    if seen:
        by_category = ", ".join(f"{c} {seen[c]}" for c in CATEGORIES if seen[c])
        gate.notes.append(
            f"{sum(seen.values())} regressions expected ({by_category}); "
            f"{intermittent_seen} of them not confirmed by the reruns"
        )
    if settled_intermittent:
        gate.notes.append(
            f"{len(settled_intermittent)} expected intermittent regressions did not regress this "
            "time: " + "; ".join(settled_intermittent)
        )
    if partial:
        skipped = sum(1 for i in expected if i not in unguarded and i not in guarded)
        gate.notes.append(f"--only: {skipped} expected entries outside the tests run, not checked")
    return gate


def code_digest(root: Path = REPO) -> str:
    """A digest of the `idempotency` package under `root` (the working tree, or a snapshot)."""
    digest = hashlib.sha256()
    for path in sorted((root / "idempotency").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def take_snapshot(work: Path) -> Path:
    """A copy of the working tree's `idempotency` package, for every guarded process to import."""
    snapshot = work / "snapshot"
    shutil.rmtree(snapshot, ignore_errors=True)
    shutil.copytree(
        REPO / "idempotency",
        snapshot / "idempotency",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    return snapshot


def totals(run: ModeRun) -> Counter[str]:
    return Counter(r.outcome for r in run.results.values())


def guard_stats(stats: Path) -> tuple[int, int, int, int, set[str]]:
    """(servers guarded, in how many processes, servers in child interpreters, how many,
    the folders `idempotency` was imported from)."""
    servers = processes = child_servers = children = 0
    sources: set[str] = set()
    for path in stats.glob("*.count"):
        count, role, source, *_ = path.read_text(encoding="utf-8").split()
        servers += int(count)
        processes += 1
        sources.add(source)
        if role == "child":
            child_servers += int(count)
            children += 1
    return servers, processes, child_servers, children, sources


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
    collected: set[str] | None,
) -> str:
    """The run's report; `collected` is the unguarded collection when only the guarded
    failures ran unguarded (`--baseline failures`), else None."""
    unguarded, guarded = runs["unguarded"], runs["guarded"]
    code: dict[str, str] = info.get("code", {})
    snapshot = info.get("snapshot")
    if snapshot:
        under_test = (
            f"- mcp-once: `idempotency/` as it was in the working tree at {REPO} when the runs "
            f"started (HEAD {info.get('commit', '?')}, plus the uncommitted changes in "
            f"{work}/idempotency.diff), copied to {snapshot} (digest {code.get('snapshot')}) "
            "and imported from there by every guarded process, reruns included"
        )
        if code.get("working tree at end") != code.get("snapshot"):
            under_test += (
                f"; the working tree has changed since (digest now "
                f"{code.get('working tree at end')})"
            )
    else:
        moved = len(set(code.values())) > 1
        under_test = (
            f"- mcp-once: the working tree at {REPO} (editable), HEAD "
            f"{info.get('commit', '?')}; digest of idempotency/: "
            + ", ".join(f"{k} {v}" for k, v in code.items())
            + (" — **the code changed during the runs**" if moved else " (unchanged)")
        )
    lines = [
        f"# FastMCP {FASTMCP_VERSION}'s test suite, without and with mcp-once's middleware",
        "",
        f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        under_test,
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
    if info.get("baseline") == "failures":
        lines.insert(
            -5,
            "- Baseline: the guarded run first, then only its failures unguarded "
            "(`--baseline failures`); the unguarded row counts those alone",
        )
    for run in (unguarded, guarded):
        t = totals(run)
        phase_times = ", ".join(f"{p.phase.name} {p.seconds:.0f}s" for p in run.phases)
        lines.append(
            f"| {run.mode} | {run.seconds:.0f}s ({phase_times}) | {sum(t.values())} "
            f"| {t['passed']} | {t['failed']} | {t['error']} | {t['skipped']} | {t['xfailed']} |"
        )
    servers, processes, child_servers, children, sources = guard_stats(work / "guard-stats")
    lines += [
        "",
        f"Guard check (guarded run): {servers} servers got the middleware, in {processes} "
        f"processes; {child_servers} of them in {children} child interpreters (not pytest's). "
        f"`idempotency` imported from: {', '.join(sorted(sources)) or '(nowhere)'}.",
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
    if collected is not None:
        # The unguarded run held only the guarded failures: "only guarded" is every test that
        # passed guarded. What the gate checks instead is the unguarded collection.
        only_guarded = []
        only_unguarded = [
            Result(i, i.split("::", 1)[0], "not run", "collected unguarded, not in the guarded run")
            for i in sorted(collected)
            if i not in ids_after
        ]
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


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    """SIGTERM/SIGHUP: exit through the `finally` blocks that put the `.pth` file back."""
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)
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
    parser.add_argument(
        "--no-snapshot",
        dest="snapshot",
        action="store_false",
        help="import idempotency/ from the working tree live, not from a copy taken at start",
    )
    parser.add_argument(
        "--expect",
        type=Path,
        metavar="FILE",
        help="the gate: exit 1 if a confirmed regression is not listed in FILE (TOML [[test]] "
        "tables with id, category, reason; see expected.toml), or if the runs cannot be judged",
    )
    parser.add_argument(
        "--gate",
        action="store_true",
        help=f"the gate with the expected list next to run.py (--expect {DEFAULT_EXPECT.name})",
    )
    parser.add_argument(
        "--baseline",
        choices=("full", "failures"),
        default="full",
        help="full: run the whole suite unguarded too; failures: run the guarded suite first and "
        "only its failures unguarded (one full run instead of two)",
    )
    parser.add_argument(
        "--max-baseline-failures",
        type=int,
        default=50,
        metavar="N",
        help="the gate fails if more than N tests fail unguarded (a broken environment)",
    )
    args = parser.parse_args(args_list)
    expect_path: Path | None = args.expect or (DEFAULT_EXPECT if args.gate else None)
    expected: dict[str, Expected] = {}
    if expect_path is not None:
        try:  # checked before the runs, not after them
            expected = load_expected(expect_path)
        except ValueError as exc:
            parser.error(f"--expect: {exc}")

    source: Path = args.source.resolve()
    work: Path = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    # --reuse runs nothing: it needs no sdist tree (the report names the one the runs used)
    source_note = "" if args.reuse else ensure_source(source)
    if installed("fastmcp") != FASTMCP_VERSION:
        print(f"warning: fastmcp {installed('fastmcp')} is installed, not {FASTMCP_VERSION}")
    all_phases = phases(args.timeout, args.integration_timeout)
    if args.only:
        all_phases = tuple(dataclasses.replace(p, paths=tuple(args.only)) for p in all_phases)

    summary = work / "run.json"
    runs: dict[str, ModeRun] = {}
    collected: set[str] | None = None
    snapshot: Path | None = None
    if args.reuse:
        info: dict[str, Any] = json.loads(summary.read_text()) if summary.is_file() else {}
        source_note = info.get("source", str(source))
        times: dict[str, float] = info.get("times", {})
        if info.get("baseline") == "failures":
            collected = set((work / "collected.txt").read_text().splitlines())
        for mode in MODES:
            parsed = stored_runs(work, "", mode, all_phases, times, info.get("exit_codes"))
            if collected is not None and mode == "unguarded":  # only the phases that had failures
                parsed = [p for p in parsed if p.junit.is_file()]
            runs[mode] = ModeRun(mode, parsed, results_of(parsed, work, "", mode))
    else:
        info = {"commit": git("rev-parse", "--short", "HEAD"), "code": {}}
        diff = git("diff", "HEAD", "--", "idempotency")
        if args.snapshot:
            snapshot = take_snapshot(work)
            (work / "idempotency.diff").write_text(diff + "\n", encoding="utf-8")
            info["snapshot"] = str(snapshot)
            info["code"]["snapshot"] = code_digest(snapshot)
        order = MODES if args.baseline == "full" else tuple(reversed(MODES))
        for mode in order:
            if snapshot is None:
                info["code"][f"{mode} start"] = code_digest()
            targets = None
            if mode == "unguarded" and args.baseline == "failures":
                failed = (r for r in runs["guarded"].results.values() if r.outcome in FAILED)
                targets = ids_by_phase(failed)
            runs[mode] = run_mode(
                mode, all_phases, source, work, args.workers, snapshot, targets=targets
            )
            if snapshot is None:
                info["code"][f"{mode} end"] = code_digest()
        if args.baseline == "failures":
            collected = collected_ids(all_phases, source, work)
            (work / "collected.txt").write_text(
                "\n".join(sorted(collected)) + "\n", encoding="utf-8"
            )
        info["baseline"] = args.baseline
        info["times"] = {
            f"{m}-{p.phase.name}": p.seconds for m, r in runs.items() for p in r.phases
        }
        info["exit_codes"] = {
            f"{m}-{p.phase.name}": p.exit_code for m, r in runs.items() for p in r.phases
        }
        info["only"] = args.only or []
        info["source"] = source_note

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
                results_of(
                    stored_runs(work, f"rerun{n}-", mode, all_phases, {}), work, f"rerun{n}-", mode
                )
                for n in rounds
            ]
            for mode in MODES
        }
        if rounds:
            verdicts = Rerun(reruns["unguarded"], reruns["guarded"])
    elif found and args.rerun_rounds > 0:
        verdicts = rerun(found, all_phases, source, work, args.workers, snapshot, args.rerun_rounds)
    if not args.reuse:
        info["code"]["working tree at end"] = code_digest()
        summary.write_text(json.dumps(info, indent=1), encoding="utf-8")
    text = report(runs, found, verdicts, source_note, work, args_list, info, collected)
    gate: Gate | None = None
    if expect_path is not None:
        gate = judge(
            runs,
            found,
            verdicts,
            expected,
            expect_path,
            work,
            partial=bool(args.only or info.get("only")),
            snapshot=info.get("snapshot"),
            max_baseline_failures=args.max_baseline_failures,
            collected=collected,
        )
        text += "\n## Gate\n\n" + "\n".join(gate.lines(bullet="- ", limit=1000)) + "\n"
    args.report.write_text(text, encoding="utf-8")
    print(text)
    print(f"\nreport: {args.report}")
    if gate is None:
        return 0
    print("\n" + "\n".join(gate.lines()), flush=True)
    return 0 if gate.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
