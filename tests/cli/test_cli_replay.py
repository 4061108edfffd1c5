"""The proxy's previous first answers, replayed when provably the same (issue 46, item 3;
`mcp_once/_upstream/replay.py`).

Each start is a fresh interpreter running `mcp-once proxy` over real pipes, in a state folder of
the test's own, in front of a plain JSON-lines upstream whose answers a file decides
(`replay_upstream.py`). A Python audit hook in the proxy's process holds its first import of
FastMCP (or the SDK, or pydantic) until the test has both answers, or a deadline passes, and
reports which came first: the interpreter raises the event, so the order cannot be staged by
the code under test. Without the replay, the answers can only come after that import: the
report says so and the test fails.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import StdioServerParameters
from mcp.client import Client

from idempotency import wire
from mcp_once._upstream import inputs, replay

HERE = Path(__file__).parent
UPSTREAM = [sys.executable, str(HERE / "replay_upstream.py")]
#: How long one answer may take on a loaded machine.
ANSWER_WAIT = 60.0

#: Holds the first heavy import until the file `marker` exists (or `wait` s pass), then writes
#: to `report` whether it existed: whether the caller had its answers before FastMCP came in.
_GATED = """
import json, os, sys, time
report, marker, wait = sys.argv.pop(1), sys.argv.pop(1), float(sys.argv.pop(1))
seen = {}
def hook(event, args):
    if event == "import" and args[0] in ("fastmcp", "mcp", "pydantic") and not seen:
        deadline = time.monotonic() + wait
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.01)
        seen["answered_before_import"] = os.path.exists(marker)
        with open(report, "w") as f:
            json.dump(seen, f)
sys.addaudithook(hook)
from mcp_once._cli import main
sys.exit(main(sys.argv[1:]))
"""

TOOLS = [
    {
        "name": "read",
        "description": "reads",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "write",
        "description": "writes",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
]


def initialize(version: str = "2025-11-25", name: str = "raw") -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": name, "version": "1"},
        },
    }


class Folder:
    """One test's state folder, upstream file and the proxy's command line."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.spec = root / "upstream.json"
        self.spec.write_text(json.dumps({"tools": TOOLS}))
        self.options = ["--store", "memory://"]
        self.starts = 0

    def argv(self, wait: float) -> tuple[list[str], Path, Path]:
        self.starts += 1
        report = self.root / f"report-{self.starts}.json"
        marker = self.root / f"answered-{self.starts}"
        argv = [sys.executable, "-c", _GATED, str(report), str(marker), str(wait), "proxy"]
        return [*argv, *self.options, "--", *UPSTREAM, str(self.spec)], report, marker

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "XDG_STATE_HOME": str(self.root / "state")}

    def replay_file(self) -> Path | None:
        found = list((self.root / "state" / "mcp-once").glob(f"*{replay.SUFFIX}"))
        assert len(found) <= 1
        return found[0] if found else None

    def stored(self) -> dict[str, Any]:
        path = self.replay_file()
        assert path is not None
        stored: dict[str, Any] = json.loads(path.read_text())
        return stored

    def methods(self) -> dict[int, list[str]]:
        """The methods each upstream child was sent, by its process id."""
        found: dict[int, list[str]] = {}
        for line in self.spec.with_suffix(".methods").read_text().splitlines():
            entry = json.loads(line)
            found.setdefault(entry["pid"], []).append(entry["method"])
        return found

    def ledger(self) -> list[dict[str, Any]]:
        path = self.spec.with_suffix(".ledger")
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines]


@pytest.fixture
def folder(tmp_path: Path) -> Folder:
    return Folder(tmp_path)


class Started:
    """What one start said: its two answers as bytes, whether they came before the import, and
    its stderr."""

    def __init__(self, init: bytes, listing: bytes, before_import: bool, stderr: str) -> None:
        self.init, self.listing, self.before_import, self.stderr = (
            init,
            listing,
            before_import,
            stderr,
        )

    @property
    def tools(self) -> list[str]:
        return [tool["name"] for tool in json.loads(self.listing)["result"]["tools"]]


def _line(fd: int, buffer: bytearray) -> bytes:
    deadline = time.monotonic() + ANSWER_WAIT
    while b"\n" not in buffer:
        left = deadline - time.monotonic()
        assert left > 0, "no answer from the proxy"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 1 << 16)
            assert chunk, "the proxy closed its stdout"
            buffer += chunk
    end = buffer.index(b"\n")
    line = bytes(buffer[:end])
    del buffer[: end + 1]
    return line


def start(
    folder: Folder,
    caller: dict[str, Any] | None = None,
    *,
    wait: float = 0.0,
    first: dict[str, Any] | None = None,
) -> Started:
    """One start answering a raw JSON-lines caller's `initialize` and `tools/list`, then
    stopped by stdin's EOF. `wait`: how long the proxy's first heavy import is held for the
    answers; `first`: a request the caller sends before its `initialize` (its answer read)."""
    argv, report, marker = folder.argv(wait)
    stderr = folder.root / f"stderr-{folder.starts}.txt"
    with stderr.open("w") as err:
        process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=folder.env
        )
    assert process.stdin is not None and process.stdout is not None
    try:
        buffer = bytearray()

        def send(message: dict[str, Any]) -> None:
            assert process.stdin is not None
            process.stdin.write((json.dumps(message) + "\n").encode())
            process.stdin.flush()

        if first is not None:
            send(first)
            _line(process.stdout.fileno(), buffer)
        send(caller or initialize())
        init = _line(process.stdout.fileno(), buffer)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        listing = _line(process.stdout.fileno(), buffer)
        marker.touch()
        process.stdin.close()
        assert process.wait(ANSWER_WAIT) == 0
    finally:
        if process.returncode is None:
            process.kill()
            process.wait()
    seen = json.loads(report.read_text())
    return Started(init, listing, seen["answered_before_import"], stderr.read_text())


def no_replay_errors(started: Started) -> None:
    assert "replay:" not in started.stderr, started.stderr


def test_a_second_start_answers_before_fastmcp_is_imported_with_the_first_start_bytes(
    folder: Folder,
) -> None:
    """The core: the second start's `initialize` and `tools/list` answers come before FastMCP
    (or the SDK) is imported, byte for byte the first start's; FastMCP's own answers, compared
    once it is up, are equal (no error, the file kept)."""
    first = start(folder)
    assert not first.before_import  # not vacuous: the normal path answers after the import
    assert folder.replay_file() is not None
    # Beside the manifest, not one more `*.json` for `mcp-once proxy --list` to read as one.
    assert len(list((folder.root / "state" / "mcp-once").glob("*.json"))) == 1
    second = start(folder, wait=ANSWER_WAIT)
    assert second.before_import
    assert (second.init, second.listing) == (first.init, first.listing)
    no_replay_errors(second)
    assert folder.replay_file() is not None  # FastMCP's answers equal: the proof held
    # One child per start, one handshake each: the second start's link adopted the one the
    # replay made (a second `initialize` would reach the child otherwise).
    methods = folder.methods()
    assert len(methods) == 2, methods
    for sent in methods.values():
        assert sent.count("initialize") == 1 and sent.count("notifications/initialized") == 1


@pytest.mark.slow
def test_a_changed_upstream_listing_is_answered_from_the_upstream(folder: Folder) -> None:
    """Same command line, same caller: the upstream's listing changed (its file). The replay
    misses at the child's answer and FastMCP answers; the file is written again from it."""
    start(folder)
    folder.spec.write_text(json.dumps({"tools": [*TOOLS, {**TOOLS[0], "name": "more"}]}))
    second = start(folder)
    assert second.tools == ["read", "write", "more"]
    assert not second.before_import
    no_replay_errors(second)
    third = start(folder, wait=ANSWER_WAIT)  # recorded again from the second start
    assert third.before_import and third.listing == second.listing


@pytest.mark.slow
def test_a_changed_upstream_initialize_is_answered_from_the_upstream(folder: Folder) -> None:
    """The child's `initialize` result changed (its instructions): a miss after the child's
    handshake, which the link adopts; FastMCP answers with the new instructions."""
    first = start(folder)
    folder.spec.write_text(json.dumps({"tools": TOOLS, "instructions": "now with these"}))
    second = start(folder)
    assert not second.before_import
    assert json.loads(second.init)["result"].get("instructions") == "now with these"
    assert "instructions" not in json.loads(first.init)["result"]
    no_replay_errors(second)


@pytest.mark.slow
def test_a_changed_option_file_misses(folder: Folder) -> None:
    """Same command line, the policy file it names changed: the answers are FastMCP's for the
    new policy (the proxy's per-tool `_meta` follows it), not the stored ones."""
    policy = folder.root / "policy.toml"
    policy.write_text('[tools."write"]\nguard = false\n')
    folder.options = [*folder.options, "--policy", str(policy)]
    first = start(folder)
    policy.write_text('[tools."write"]\nupstream_idempotent = true\n')
    second = start(folder)
    assert not second.before_import
    assert second.listing != first.listing
    reference_file = folder.replay_file()
    assert reference_file is not None
    reference_file.unlink()
    reference = start(folder)  # no file at all: the normal path
    assert second.listing == reference.listing


@pytest.mark.slow
def test_a_changed_caller_initialize_misses(folder: Folder) -> None:
    """Another caller (another protocol version) gets FastMCP's answer for its own
    `initialize`, not the stored one; the file then holds the new caller's."""
    first = start(folder)
    second = start(folder, initialize(version="2025-06-18"))
    assert not second.before_import
    assert json.loads(first.init)["result"]["protocolVersion"] == "2025-11-25"
    assert json.loads(second.init)["result"]["protocolVersion"] == "2025-06-18"
    assert "2025-06-18" in folder.stored()["caller_initialize"]


@pytest.mark.slow
def test_a_traced_caller_is_replayed_though_its_trace_context_is_new(folder: Folder) -> None:
    """A caller with a tracer provider sends a new W3C trace context in every request's `_meta`
    (the SDK's client does): the rest of its `initialize` the same, it is replayed (the context
    is nothing FastMCP's answers are made of); anything else in `_meta` still misses. Found when
    an earlier test in the process had set a tracer provider: every start missed."""

    def traced(parent: str, **more: str) -> dict[str, Any]:
        message = initialize()
        message["params"]["_meta"] = {"traceparent": parent, **more}
        return message

    first = start(folder, traced(f"00-{'1' * 32}-{'a' * 16}-01"))
    second = start(folder, traced(f"00-{'2' * 32}-{'b' * 16}-01", tracestate="k=v"), wait=3.0)
    assert second.before_import
    assert (second.init, second.listing) == (first.init, first.listing)
    third = start(folder, traced(f"00-{'3' * 32}-{'c' * 16}-01", other="x"), wait=3.0)
    assert not third.before_import


@pytest.mark.slow
def test_the_file_is_not_written_when_the_first_listing_failed(folder: Folder) -> None:
    """An upstream whose listing fails after the proxy's opening one: the caller's first
    `tools/list` gets FastMCP's error for that, and nothing is recorded (a later start would
    otherwise replay a failure)."""
    folder.spec.write_text(json.dumps({"tools": TOOLS, "fail_list_after": 1}))
    failed = start(folder)
    assert "error" in json.loads(failed.listing), failed.listing
    assert folder.replay_file() is None
    folder.spec.write_text(json.dumps({"tools": TOOLS}))
    start(folder)  # not vacuous: the same start with a listing that works writes it
    assert folder.replay_file() is not None


@pytest.mark.slow
def test_an_answer_fastmcp_would_not_give_is_caught_and_the_file_deleted(folder: Folder) -> None:
    """The comparison is real: a replay file whose stored `initialize` answer was altered (what
    a replay that hashed too little would send) is sent, FastMCP's own answer then differs, and
    the proxy says so and deletes the file."""
    start(folder)
    path = folder.replay_file()
    assert path is not None
    stored = json.loads(path.read_text())
    stored["initialize_answer"] = stored["initialize_answer"].replace(
        '"listChanged":true', '"listChanged":false', 1
    )
    path.write_text(json.dumps(stored))
    second = start(folder, wait=ANSWER_WAIT)
    assert second.before_import
    assert "replay: FastMCP's answer to the caller's initialize differs" in second.stderr
    assert "result/capabilities" in second.stderr
    assert folder.replay_file() is None


@contextmanager
def released(marker: Path) -> Iterator[None]:
    try:
        yield
    finally:
        marker.touch()


@pytest.mark.slow
@pytest.mark.anyio
async def test_tool_calls_after_a_replayed_start(folder: Folder) -> None:
    """A real SDK client over stdio: after a replayed start, a pass-through call and a guarded
    keyed call (sent twice under one key: one effect in the upstream's ledger) work."""
    for wait in (0.0, ANSWER_WAIT):
        argv, report, marker = folder.argv(wait)
        proxy = StdioServerParameters(command=argv[0], args=argv[1:], env=folder.env)
        with released(marker):  # a handshake-era caller: the one the replay answers
            async with Client(proxy, mode="legacy") as client:
                listed = await client.list_tools()
                marker.touch()
                assert [tool.name for tool in listed.tools] == ["read", "write"]
                read = await client.call_tool("read", {"text": f"r{wait}"})
                meta = {wire.KEY_META: f"key-{wait}"}
                write = await client.call_tool("write", {"text": f"w{wait}"}, meta=meta)
                again = await client.call_tool("write", {"text": f"w{wait}"}, meta=meta)
        assert not read.is_error and not write.is_error and not again.is_error
        assert json.loads(report.read_text())["answered_before_import"] == (wait > 0)
    writes = [entry for entry in folder.ledger() if entry["tool"] == "write"]
    assert len(writes) == 2  # one per start: the second call of each was the guard's record
    assert len([entry for entry in folder.ledger() if entry["tool"] == "read"]) == 2


@pytest.mark.slow
def test_replay_off_writes_and_replays_nothing(
    folder: Folder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`MCP_ONCE_REPLAY=0`: the usual start, no file."""
    monkeypatch.setenv(replay.SWITCH, "0")
    first = start(folder)
    assert not first.before_import
    assert folder.replay_file() is None


def digest(files: list[str]) -> str | None:
    static = replay.static_inputs(files)
    assert static is not None
    return static.digest()


def test_the_static_digest_follows_the_environment_and_the_option_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What no subprocess test varies cheaply: a `FASTMCP_*` or `MCP_ONCE_*` variable, the
    contents of a file an option names, a file too large to hash (never replayed)."""
    policy = tmp_path / "policy.toml"
    policy.write_text("# one\n")
    before = digest([str(policy)])
    assert before is not None and digest([str(policy)]) == before
    monkeypatch.setenv("UNRELATED_VARIABLE", "x")
    assert digest([str(policy)]) == before
    monkeypatch.setenv("FASTMCP_SOMETHING", "x")
    changed_env = digest([str(policy)])
    assert changed_env != before
    policy.write_text("# two\n")
    assert digest([str(policy)]) not in (before, changed_env)
    monkeypatch.setattr(inputs, "_FILE_MAX", 3)
    assert replay.static_inputs([str(policy)]) is None


def test_fastmcps_dotenv_file_is_part_of_the_static_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FastMCP's settings read `.env` in the working directory (or `FASTMCP_ENV_FILE`): a
    changed one is a changed start, though no option names it."""
    monkeypatch.chdir(tmp_path)
    before = digest([])
    (tmp_path / ".env").write_text("FASTMCP_LOG_LEVEL=DEBUG\n")
    assert digest([]) != before


def test_the_costly_inputs_are_taken_when_asked_and_then_as_at_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The distributions and mcp-once's sources (most of the digest's cost) are read when the
    digest is first asked for, not at the start; a distributions folder or a source changed
    since the start gives no digest (answers made from the old state are not recorded under the
    new one's); the same state, the same digest as taken at once."""
    past = time.time_ns() - 60 * 10**9
    site = tmp_path / "site"
    (site / "thing-1.0.dist-info").mkdir(parents=True)
    source = tmp_path / "root" / "mcp_once" / "module.py"
    source.parent.mkdir(parents=True)
    source.write_text("x = 1\n")
    for path in (site, source):
        os.utime(path, ns=(past, past))
    monkeypatch.setattr(sys, "path", [str(site)])
    monkeypatch.setattr(inputs, "_ROOT", tmp_path / "root")
    monkeypatch.chdir(tmp_path)

    taken = replay.static_inputs([])
    assert taken is not None
    at_once = taken.digest()
    assert at_once is not None and taken.digest() == at_once

    upgraded = replay.static_inputs([])
    assert upgraded is not None
    (site / "thing-1.0.dist-info").rename(site / "thing-1.1.dist-info")
    assert upgraded.digest() is None
    (site / "thing-1.1.dist-info").rename(site / "thing-1.0.dist-info")
    os.utime(site, ns=(past, past))

    edited = replay.static_inputs([])
    assert edited is not None
    source.write_text("x = 2\n")  # an editor's save: its mtime now
    assert edited.digest() is None
    source.write_text("x = 1\n")
    os.utime(source, ns=(past, past))
    again = replay.static_inputs([])
    assert again is not None and again.digest() == at_once  # not vacuous: the state restored


def test_a_first_start_takes_the_static_digest_after_its_first_listing(tmp_path: Path) -> None:
    """No replay file: the start's costly inputs are read only when the file is written, once
    the first listing's answer is out (the front calls `record` after writing it); the file
    then holds them."""

    class Counted(replay.Static):
        asked = 0

        def digest(self) -> str | None:
            Counted.asked += 1
            return "static-digest"

    path = tmp_path / f"upstream{replay.SUFFIX}"
    start = replay.Start(path, Counted({}))
    link = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    ]
    start.from_caller(json.dumps(initialize()).encode())
    start.to_child("".join(json.dumps(m) + "\n" for m in link).encode())
    results = [{"protocolVersion": "2025-11-25"}, {"tools": TOOLS}]
    for n, result in enumerate(results):
        start.from_child(json.dumps({"jsonrpc": "2.0", "id": n, "result": result}).encode() + b"\n")
    start.to_caller(0, '{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25"}}')
    start.from_caller(b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}')
    assert not start.due
    start.to_caller(1, '{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}')
    assert start.due and Counted.asked == 0 and not path.exists()  # the answer is not held
    start.record()
    assert Counted.asked == 1 and not start.due
    assert json.loads(path.read_text())["static"] == "static-digest"


@pytest.mark.slow
def test_a_caller_that_starts_otherwise_is_answered_by_fastmcp(folder: Folder) -> None:
    """A caller whose first message is not `initialize` (a `ping`, which MCP allows first): the
    replay does not answer, FastMCP answers all of it, and the file is left as it was."""
    first = start(folder)
    stored = folder.stored()
    ping = {"jsonrpc": "2.0", "id": "p", "method": "ping"}
    second = start(folder, first=ping, wait=3.0)
    assert not second.before_import
    assert (second.init, second.listing) == (first.init, first.listing)
    assert folder.stored() == stored


@pytest.mark.slow
def test_an_upstream_that_asks_its_client_first_is_never_replayed(folder: Folder) -> None:
    """An upstream that sends a request of its own (`roots/list`) before its first listing: a
    replay could not answer it, so nothing is recorded and every start is the usual one."""
    folder.spec.write_text(json.dumps({"tools": TOOLS, "ask_roots": True}))
    first = start(folder)
    assert folder.replay_file() is None
    assert first.tools == ["read", "write"]


@pytest.mark.slow
@pytest.mark.parametrize("caller", ["raw", "pipelining"], ids=["replayed", "missed"])
def test_a_caller_that_sends_all_at_once_gets_every_answer(folder: Folder, caller: str) -> None:
    """A caller that writes its `initialize`, `notifications/initialized`, `tools/list` and a
    call in one write, before any answer, read in one chunk: replayed (the first start's
    caller) or not (another caller's `initialize`: a miss at the first line), every line
    reaches FastMCP and each is answered once."""
    start(folder)
    argv, _, marker = folder.argv(0.0)
    marker.touch()
    messages = [
        initialize(name=caller),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "read",
         "arguments": {"text": "all at once"}}},
    ]  # fmt: skip
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=folder.env)
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write("".join(json.dumps(m) + "\n" for m in messages).encode())
        process.stdin.flush()
        buffer = bytearray()
        lines = [_line(process.stdout.fileno(), buffer) for _ in range(3)]
        process.stdin.close()
        assert process.wait(ANSWER_WAIT) == 0
        assert buffer + process.stdout.read() == b""  # nothing answered twice
    finally:
        if process.returncode is None:
            process.kill()
            process.wait()
    answers = {a.get("id"): a for a in map(json.loads, lines)}
    assert sorted(answers) == [0, 1, 2]
    assert all("result" in a for a in answers.values()), answers
    assert answers[2]["result"]["content"][0]["text"] == "all at once"
