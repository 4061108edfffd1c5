"""Log lines an operator can alert on (issue 48), under the `idempotency` logger: WARNING for an
OUTCOME_UNKNOWN (-32012) answer, a lease lost by the guard's own renewal, and a reconciliation
that could not decide; INFO for the refusals (KEY_REUSED -32011, IN_PROGRESS -32010); DEBUG for a
replay. Each names the record (12 hex of its store key), the tool and the server, in its message
and as fields of the log record, and never the key, an argument or a result. The metric's and the
span's outcome for a reused key is the history's name for it, `key_reused`.

Real MCP sessions (in memory) to a guarded `MCPServer` named "shop"; the store's clock is moved,
never slept through. A record a worker left IN_PROGRESS when it was killed is made as that
worker's claim would have made it (the store's own claim, under the guard's store key).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest
from fake_clock import FakeClock
from mcp import MCPError
from mcp.client import Client
from otel_spans import recorder
from server_kit import (
    SOON,
    Effects,
    call_fingerprint,
    effect_server,
    lose_the_lease,
    marker,
    meta,
    record_key,
)

from idempotency import MemoryKeyStore, Reconciled, wire
from idempotency._guard.telemetry import Outcome
from idempotency._stores.history import REFUSED

pytestmark = pytest.mark.anyio

KEY = "key-PRIVATE-0451"
ORDER = "order-SECRET-77"
ARGS: dict[str, Any] = {"order": ORDER, "cents": 500}
RESULT_TEXT = f"charged 500 for {ORDER}"
LEASE = 0.3  # renewed every 0.1 s (real time)
RECORD = record_key("shop", "charge", KEY)[:12]
FIELDS = ("mcp_once_event", "mcp_once_record", "mcp_once_tool", "mcp_once_server")


class Lines(logging.Handler):
    """What the `idempotency` logger emits at or above a level, with the record's fields."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.heard = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.heard.set()

    def said(self) -> list[tuple[int, str, str]]:
        """(level, event, message) of each line."""
        return [(r.levelno, getattr(r, "mcp_once_event", ""), r.getMessage()) for r in self.records]

    def fields(self) -> list[tuple[object, ...]]:
        return [tuple(getattr(r, name, None) for name in FIELDS) for r in self.records]

    def text(self) -> str:
        """Everything the lines hold: messages, arguments, fields."""
        return repr([(r.getMessage(), r.args, vars(r)) for r in self.records])


@contextmanager
def logging_at(level: int) -> Iterator[Lines]:
    """The `idempotency` logger at `level`, as an application configures it."""
    lines = Lines()
    logger = logging.getLogger("idempotency")
    before = logger.level
    logger.addHandler(lines)
    logger.setLevel(level)
    try:
        yield lines
    finally:
        logger.removeHandler(lines)
        logger.setLevel(before)


def never_the_callers_data(lines: Lines) -> None:
    text = lines.text()
    for secret in (KEY, ORDER, RESULT_TEXT):
        assert secret not in text, secret


def about(event: str) -> tuple[str, str, str, str]:
    return (event, RECORD, "charge", "shop")


async def killed_mid_charge() -> MemoryKeyStore:
    """A store as a worker killed mid-charge left it: the record IN_PROGRESS under its claim,
    its lease run out long ago (nobody renews it)."""
    clock = FakeClock()
    store = MemoryKeyStore(clock=clock)
    await store.claim(
        record_key("shop", "charge", KEY),
        call_fingerprint("charge", ARGS),
        lease=LEASE,
        takeover=False,
        tool="charge",
    )
    clock.advance(60)
    return store


async def test_an_unknown_answer_leaves_one_warning_naming_record_tool_and_server() -> None:
    store = await killed_mid_charge()
    effects = Effects()
    server = effect_server(store, effects, gated=False, lease=LEASE)
    with logging_at(logging.WARNING) as lines, anyio.fail_after(SOON):
        async with Client(server) as client:
            with pytest.raises(MCPError) as caught:
                await client.call_tool("charge", ARGS, meta=meta(KEY))
    assert caught.value.code == wire.OUTCOME_UNKNOWN and effects.count == 0
    # This answer's claim turned the record UNKNOWN: that is said once per record (`in_doubt`,
    # rule 25: tests/server/test_in_doubt_alert.py), the answer once per answer.
    [(level, event, message)] = [said for said in lines.said() if said[1] != "in_doubt"]
    assert [event for _, event, _ in lines.said()] == ["in_doubt", "unknown"]
    assert (level, event) == (logging.WARNING, "unknown")
    assert message == (
        f"record {RECORD} (tool 'charge', server 'shop'): answered OUTCOME_UNKNOWN (-32012): an"
        " earlier execution stopped mid-tool (its holder died or its lease ran out) and this tool"
        " is not safe to run twice; reconcile the record or settle it"
    )
    assert lines.fields() == [about("in_doubt"), about("unknown")]
    never_the_callers_data(lines)


async def test_refusals_are_info_and_a_replay_is_debug() -> None:
    effects = Effects()
    server = effect_server(MemoryKeyStore(), effects, lease=LEASE, wait=0.05)
    with logging_at(logging.DEBUG) as lines, anyio.fail_after(SOON):
        async with Client(server) as client, anyio.create_task_group() as tg:
            first: list[Any] = []

            async def run() -> None:
                first.append(await client.call_tool("charge", ARGS, meta=meta(KEY)))

            tg.start_soon(run)
            await effects.started.wait()
            executed = len(lines.records)  # an execution under way says nothing
            with pytest.raises(MCPError) as busy:  # waits 0.05 s for the running one
                await client.call_tool("charge", ARGS, meta=meta(KEY))
            effects.open()
        async with Client(server) as client:
            again = await client.call_tool("charge", ARGS, meta=meta(KEY))
            with pytest.raises(MCPError) as reused:
                await client.call_tool("charge", {**ARGS, "cents": 1}, meta=meta(KEY))
    assert executed == 0
    assert busy.value.code == wire.IN_PROGRESS and reused.value.code == wire.KEY_REUSED
    assert marker(first[0])["status"] == "executed" and marker(again)["status"] == "replayed"
    assert [(level, event) for level, event, _ in lines.said()] == [
        (logging.INFO, "in_progress"),
        (logging.DEBUG, "replayed"),
        (logging.INFO, "key_reused"),
    ]
    prefix = f"record {RECORD} (tool 'charge', server 'shop'): "
    assert [message.removeprefix(prefix) for _, _, message in lines.said()] == [
        "refused IN_PROGRESS (-32010): another attempt holds the record",
        "replayed its stored answer",
        "refused KEY_REUSED (-32011): the key came again with other arguments",
    ]
    assert lines.fields() == [about("in_progress"), about("replayed"), about("key_reused")]
    never_the_callers_data(lines)


async def test_at_warning_the_refusals_and_replays_say_nothing() -> None:
    server = effect_server(MemoryKeyStore(), Effects(), gated=False)
    with logging_at(logging.WARNING) as lines:
        async with Client(server) as client:
            for _ in "12":
                await client.call_tool("charge", ARGS, meta=meta(KEY))
            with pytest.raises(MCPError):
                await client.call_tool("charge", {**ARGS, "cents": 1}, meta=meta(KEY))
    assert lines.records == []


async def test_a_lost_lease_is_a_warning_naming_record_tool_and_server() -> None:
    clock = FakeClock()
    store = MemoryKeyStore(clock=clock)
    effects = Effects()
    server = effect_server(store, effects, lease=LEASE)
    with logging_at(logging.WARNING) as lines, anyio.fail_after(SOON):
        async with Client(server) as client:
            errors = await lose_the_lease(
                lambda: client.call_tool("charge", ARGS, meta=meta(KEY)),
                effects,
                store,
                clock,
                key=KEY,
                args=ARGS,
                takeover=False,
            )
    assert [e.code for e in errors] == [wire.OUTCOME_UNKNOWN] and effects.cancelled == 1
    # The lost lease as the renewal found it, then the caller's -32012 answer: one line each.
    prefix = f"record {RECORD} (tool 'charge', server 'shop'): "
    assert lines.said() == [
        (
            logging.WARNING,
            "lease_ran_out",
            f"{prefix}lost its lease (another attempt took it over, or it turned UNKNOWN) while"
            " the tool ran: cancelling it",
        ),
        (
            logging.WARNING,
            "unknown",
            f"{prefix}answered OUTCOME_UNKNOWN (-32012): this execution was cut short mid-tool;"
            " reconcile the record or settle it",
        ),
    ]
    assert lines.fields() == [about("lease_ran_out"), about("unknown")]
    never_the_callers_data(lines)


async def test_a_reconciler_that_cannot_decide_is_a_warning() -> None:
    store = await killed_mid_charge()
    asked: list[str] = []

    def reconcile(doubt: Any) -> Reconciled:
        asked.append(doubt.tool)
        return Reconciled.unknown()

    server = effect_server(store, Effects(), gated=False, lease=LEASE, reconcile=reconcile)
    with logging_at(logging.WARNING) as lines, anyio.fail_after(SOON):
        async with Client(server) as client:
            with pytest.raises(MCPError) as caught:
                await client.call_tool("charge", ARGS, meta=meta(KEY))
    assert caught.value.code == wire.OUTCOME_UNKNOWN and asked == ["charge"]
    assert [(level, event) for level, event, _ in lines.said()] == [
        (logging.WARNING, "in_doubt"),
        (logging.WARNING, "reconcile_unknown"),
        (logging.WARNING, "unknown"),
    ]
    assert lines.said()[1][2] == (
        f"record {RECORD} (tool 'charge', server 'shop'): the reconciler could not decide; the"
        " record stays UNKNOWN"
    )
    assert lines.fields() == [about("in_doubt"), about("reconcile_unknown"), about("unknown")]
    never_the_callers_data(lines)


async def test_a_call_passed_through_logs_nothing_of_ours_at_any_level() -> None:
    """Be invisible where you protect nothing: a keyless call to `keys="optional"`."""
    server = effect_server(MemoryKeyStore(), Effects(), gated=False, keys="optional")
    with logging_at(logging.DEBUG) as lines:
        async with Client(server) as client:
            for _ in "12":
                await client.call_tool("charge", ARGS)
    assert lines.records == []


# -- the outcome's name is the history's -----------------------------------------------------------


def test_every_refusal_the_history_names_is_an_outcome_of_that_name() -> None:
    assert {Outcome(code).value for code in REFUSED.values()} == {
        "key_reused",
        "in_progress",
        "unknown",
    }
    assert "conflict" not in {outcome.value for outcome in Outcome}


async def test_the_guards_span_names_a_reused_key_as_the_history_does() -> None:
    spans = recorder()
    server = effect_server(MemoryKeyStore(), Effects(), gated=False)
    async with Client(server) as client:
        await client.call_tool("charge", ARGS, meta=meta(KEY))
        with pytest.raises(MCPError):
            await client.call_tool("charge", {**ARGS, "cents": 1}, meta=meta(KEY))
    outcomes = [
        (s.attributes or {}).get("mcp_once.outcome")
        for s in spans.get_finished_spans()
        if s.name == "mcp-once guard charge"
    ]
    assert outcomes == ["executed", "key_reused"]
