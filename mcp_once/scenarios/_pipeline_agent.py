"""The agent of the kill-and-resume pipeline (the run tests' harness and `mcp-once demo`): a
scripted pipeline of tool calls against the shop server over HTTP, in a process of its own, that
SIGKILLs itself at the point the harness names (`MCP_ONCE_CRASH_AT=W2@3`, see `crash_at`) and is
started again until it completes. `python -m mcp_once.scenarios._pipeline_agent --zygote` is the
pre-imported parent `Zygote` forks agents from.

The pipeline (positions, as `orchestrator.Run` numbers them):
  0 set_value   1 pay   2 notify   turn of three, run concurrently: 3 pay, 4 set_value, 5 notify
  6 pay   7 set_value
The turn's calls are started in reverse order and finish in any order; their positions come
from their index in the "model response", not from timing.

The windows, in the life of a call at one position:
- W1: the intent is recorded and nothing is sent (the session's `call_tool` is entered);
- W2: the server ran the tool and answered; the agent dies before the answer reaches the run;
- W3: the answer reached the run; it dies before the journal marks it done;
- W4: the call is over (done recorded); it dies before the next call.

`--mode fresh` is the baseline users have today: the same pipeline with a fresh key per call and
process (no `Run`), so a restart sends everything again under new keys. The output (a JSON file,
written once the pipeline completes) holds, per position, "ok" and the result text or
"unknown:<reason>" for a call that ended in `OutcomeUnknown`. Every answer the server replayed
from its record is also appended, as its position, to `<out>.replays`, as it arrives: a replay
served to a process killed right after still counts. The log has a `killed at <time>` line
before each SIGKILL, an `entering <run> at <time>` line before it enters `Run` and an
`entered <run> fence <n> at <time>` line once it did (wall clock), from which the harness reads
how long a restart took to resume, and whether it met a held run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio
from mcp import Client
from mcp_types import CallToolResult, RequestParamsMeta, TextContent

from idempotency import wire
from mcp_once.scenarios._zygote import serve_forks
from orchestrator import (
    Journal,
    OutcomeUnknown,
    RetryingSession,
    RetryPolicy,
    Run,
    RunBusy,
    RunDiverged,
    RunExpired,
    SQLiteJournal,
    Turn,
    open_journal,
    streamable_http_transport,
)

#: The environment variable naming where a process dies: `window@position`, e.g. `W2@3`.
CRASH_AT = "MCP_ONCE_CRASH_AT"
#: Exit codes the harness reads.
BUSY, DIVERGED, EXPIRED = 3, 4, 5
POSITIONS = 8
TURN = (3, 4, 5)
UNGUARDED = frozenset({2, 5})
POLICY = RetryPolicy(max_attempts=3)


def crash_at(window: str, position: int) -> None:
    """SIGKILL this process if `MCP_ONCE_CRASH_AT` names this window at this position: no
    cleanup, no flush, no `finally`, exactly what an OOM kill or a lost host does."""
    if os.environ.get(CRASH_AT) == f"{window}@{position}":
        # When, for the harness's restart-to-resume figure (the line is written before the kill).
        print(f"killed at {time.time():.6f}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def replayed(result: CallToolResult) -> bool:
    """Whether the server answered from its record (its marker says `replayed`)."""
    marker = (result.meta or {}).get(wire.IDEMPOTENCY_META)
    return isinstance(marker, dict) and marker.get("status") == "replayed"


def steps(tag: str, variant: str) -> list[tuple[str, dict[str, Any]]]:
    """The call at each position. `variant="diverge"`: the model picks another amount at 6."""
    return [
        ("set_value", {"call_id": f"{tag}-0", "name": f"{tag}-cart", "value": 3}),
        ("pay", {"call_id": f"{tag}-1", "account": "acme", "cents": 1000}),
        ("notify", {"call_id": f"{tag}-2", "message": "paid"}),
        ("pay", {"call_id": f"{tag}-3", "account": "tax", "cents": 200}),
        ("set_value", {"call_id": f"{tag}-4", "name": f"{tag}-status", "value": 7}),
        ("notify", {"call_id": f"{tag}-5", "message": "order placed"}),
        (
            "pay",
            {
                "call_id": f"{tag}-6",
                "account": "shipping",
                "cents": 999 if variant == "diverge" else 500,
            },
        ),
        ("set_value", {"call_id": f"{tag}-7", "name": f"{tag}-status", "value": 8}),
    ]


def position_of(arguments: dict[str, Any] | None) -> int:
    """The pipeline position a call stands at, read from its `call_id` (`<tag>-<position>`):
    the same in both modes, where keys are not."""
    call_id = (arguments or {}).get("call_id")
    return int(call_id.rsplit("-", 1)[1]) if isinstance(call_id, str) else -1


class KillingClient(Client):
    """`mcp.Client` whose tool calls die at W1 (before the request leaves) or W2 (after the
    answer came back, before the session sees it), and which notes each replayed answer in
    `replays` (a file appended to with one unbuffered write, so a SIGKILL loses none)."""

    replays: str | None = None

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        progress_callback: Any = None,
        *,
        meta: RequestParamsMeta | None = None,
        **kwargs: Any,
    ) -> CallToolResult:
        position = position_of(arguments)
        crash_at("W1", position)
        result = await super().call_tool(
            name, arguments, read_timeout_seconds, progress_callback, meta=meta, **kwargs
        )
        if self.replays is not None and replayed(result):
            note = os.open(self.replays, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(note, f"{position}\n".encode())
            finally:
                os.close(note)
        crash_at("W2", position)
        return result


class KillingJournal:
    """The agent's journal, dying at W3: the answer is in, the done not yet written."""

    def __init__(self, inner: Journal) -> None:
        self.inner = inner
        self.retention = inner.retention

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def mark_done(self, run_id: str, fence: int, position: int) -> None:
        crash_at("W3", position)
        await self.inner.mark_done(run_id, fence, position)


async def call(
    session: RetryingSession, position: int, plan: list[tuple[str, dict[str, Any]]]
) -> dict[str, str]:
    name, arguments = plan[position]
    try:
        result = await session.call_tool(name, arguments)
    except OutcomeUnknown as unknown:
        outcome = {"status": f"unknown:{unknown.reason}"}
    else:
        first = result.content[0] if result.content else None
        text = first.text if isinstance(first, TextContent) else ""
        outcome = {"status": "error" if result.is_error else "ok", "text": text}
    if run_mode_fresh:
        crash_at("W3", position)  # no journal: the answer is in and nothing records it
    crash_at("W4", position)
    return outcome


run_mode_fresh = False


async def pipeline(
    session: RetryingSession, run: Run | None, plan: list[tuple[str, dict[str, Any]]]
) -> dict[int, dict[str, str]]:
    """The scripted pipeline: three calls, a turn of three started in reverse order, two more."""
    out: dict[int, dict[str, str]] = {}
    for position in range(TURN[0]):
        out[position] = await call(session, position, plan)

    async def in_turn(turn: Turn | None, index: int) -> None:
        position = TURN[index]
        with turn.call(index) if turn is not None else contextlib.nullcontext():
            out[position] = await call(session, position, plan)

    with run.turn(len(TURN)) if run is not None else contextlib.nullcontext() as turn:
        async with anyio.create_task_group() as group:
            for index in reversed(range(len(TURN))):
                group.start_soon(in_turn, turn, index)
    for position in range(TURN[-1] + 1, POSITIONS):
        out[position] = await call(session, position, plan)
    return out


async def opened(gate: str) -> None:
    """Hold the run, before the pipeline, until the harness makes the file `gate` (so that it
    can start other copies against a run that is certainly held, however loaded the machine)."""
    while not await anyio.Path(gate).exists():  # noqa: ASYNC110 (a file is the only signal)
        await anyio.sleep(0.02)


def skewed(seconds: float) -> Callable[[], float] | None:
    """A wall clock `seconds` ahead (the expiry check: a resume long after the kill)."""
    if not seconds:
        return None
    return lambda: time.time() + seconds


def open_agent_journal(where: str) -> Journal:
    """`--journal`: a journal URL (`redis://...`, `sqlite:///...`), or a SQLite file path."""
    return open_journal(where) if "://" in where else SQLiteJournal(where)


async def journalled(
    args: argparse.Namespace, client: Client, plan: list[tuple[str, dict[str, Any]]]
) -> dict[int, dict[str, str]] | int:
    """The pipeline under `Run` (which waits up to `--wait` seconds for a live holder, and not at
    all for one that died on this host); an exit code for a refusal. The run is entered before
    the client connects, so the restart figure is the run's, not the server handshake's."""
    journal = KillingJournal(open_agent_journal(args.journal))
    print(f"entering {args.run_id} at {time.time():.6f}", file=sys.stderr, flush=True)
    try:
        async with Run(
            args.run_id,
            journal=journal,
            lease=args.lease,
            wait=args.wait,
            clock=skewed(args.skew),
        ) as run:
            # When it entered, for the harness's restart-to-resume figure (wall clock: the
            # harness compares it with when it saw the previous process die).
            entered = f"entered {args.run_id} fence {run.fence} at {time.time():.6f}"
            print(entered, file=sys.stderr, flush=True)
            if args.gate:
                await opened(args.gate)
            async with client:
                try:  # inside the client, whose task group would wrap the refusal
                    return await pipeline(
                        RetryingSession(client, policy=POLICY, run=run), run, plan
                    )
                except REFUSALS as refusal:
                    return refused(refusal)
    except REFUSALS as refusal:
        return refused(refusal)
    finally:
        await journal.aclose()


REFUSALS = (RunBusy, RunDiverged, RunExpired)


def refused(refusal: RunBusy | RunDiverged | RunExpired) -> int:
    """The exit code of a refusal, said on stderr for the harness."""
    print(f"{type(refusal).__name__}: {refusal}", file=sys.stderr, flush=True)
    if isinstance(refusal, RunDiverged):
        return DIVERGED
    return EXPIRED if isinstance(refusal, RunExpired) else BUSY


async def main(args: argparse.Namespace) -> int:
    global run_mode_fresh
    run_mode_fresh = args.mode == "fresh"
    plan = steps(args.tag, args.variant)
    killing = KillingClient(streamable_http_transport(args.url))
    killing.replays = f"{args.out}.replays"
    if run_mode_fresh:
        async with killing as client:
            out = await pipeline(RetryingSession(client, policy=POLICY), None, plan)
    else:
        answer = await journalled(args, killing, plan)
        if isinstance(answer, int):
            return answer
        out = answer
    await anyio.Path(args.out).write_text(json.dumps({str(p): out[p] for p in sorted(out)}))
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", choices=("run", "fresh"), default="run")
    parser.add_argument("--variant", choices=("same", "diverge"), default="same")
    parser.add_argument("--lease", type=float, default=0.75)
    parser.add_argument("--wait", type=float, default=10.0)
    parser.add_argument("--gate", default="")
    parser.add_argument("--skew", type=float, default=0.0)
    return parser.parse_args(argv)


def run_agent(argv: list[str]) -> int:
    """One agent process's life: parse `argv`, run the pipeline, its exit code.

    The libraries are silent unless asked (their loggers have only a `NullHandler`); the agent
    is an application and asks, as its users' would: their warnings (what a `Run` waits for)
    go to stderr, where the harness reads them."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    code: int = anyio.run(main, parse(argv))
    return code


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        serve_forks(run_agent)
    else:
        sys.exit(run_agent(sys.argv[1:]))
