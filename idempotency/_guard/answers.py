"""Answers on their way to a caller, kept briefly by request id, for a give-up that comes late.

Rule 15 merges a keyless call into an earlier one only when the caller gave up on the earlier
answer. Most give-ups reach the guard while the call runs, or before its answer is written
(`Guard._caller_gone`, `Guard._answered`). One does not: a client whose timeout fires while the
answer is already on its way sends `notifications/cancelled` for a request the server has
finished. The SDK drops such a cancel (nothing is in flight under that id), yet it says exactly
what rule 15 needs: that caller never received the answer, so its next identical call is a
re-send. The guard notes each derived answer it hands out (`sent`, by caller and request id);
the server-wide hook of each entry point passes every `notifications/cancelled` to `cancelled`,
which marks a noted answer undelivered in the store (`KeyStore.abandon`, fenced on its fence).

The caller's re-send may arrive right behind its cancel, and the SDK runs the two concurrently.
So a derived claim first waits for a mark still being written for its record (`settled`):
within one process the re-send always sees the mark. A re-send that lands on another replica is
answered by the store, once the mark is there (the residual window, named in the docs).

"In flight" is judged when a request arrives, not when the guard gets to it: a request the
server had already read off a connection when an answer first reached that caller was sent
before the caller could see it, so it is no deliberate repeat of that answer, even if its claim
runs only after it (a client that dispatches twice, its copy's handler scheduled late). Each
such first hand-out notes the requests then in flight on its connection (`handed_first`), and
their claims replay (`received_before`).

Bounded: the newest `KEPT` answers are remembered, each a few hundred bytes; an answer whose
cancel never comes is forgotten as newer ones arrive.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import anyio

from .._stores.store import KeyStore
from .caller import connection_of, in_flight_with
from .telemetry import logger, record_name

#: How many answers handed out, and how many early cancels, are remembered.
KEPT = 4096

#: (connection, request id) -> (store, record, fence) of an answer handed out.
_sent: OrderedDict[tuple[str, object], tuple[KeyStore, str, int]] = OrderedDict()
#: (connection, request id) of cancels that named no answer handed out: the request was still
#: being dispatched (the SDK registers it in flight only once its task runs), so the guard did
#: not see the cancel while it ran; it asks `gave_up` before it stores and hands out the answer.
_early: OrderedDict[tuple[str, object], None] = OrderedDict()
#: (connection, request id) -> records whose answer first reached that connection's caller
#: while the request was already received: it claims them as a re-send (`received_before`).
_before: OrderedDict[tuple[str, object], frozenset[str]] = OrderedDict()
#: record -> set once its late mark is written (or failed): a claim of it waits for that.
marking: dict[str, anyio.Event] = {}


def _id(request: Any) -> tuple[str, object] | None:
    """What a request is known by here: its connection and its JSON-RPC id (unique only within
    one connection, so never the caller: one user may hold several connections)."""
    connection = connection_of(request)
    request_id = getattr(request, "request_id", None)
    if connection is None or request_id is None or isinstance(request_id, bool):
        return None
    return connection, request_id


def _remember(
    table: OrderedDict[tuple[str, object], Any], key: tuple[str, object], value: Any
) -> None:
    table[key] = value
    if len(table) > KEPT:
        table.popitem(last=False)


def gave_up(request: Any) -> bool:
    """Whether a cancel for `request` arrived before its answer was handed out, and was not yet
    seen by the guard (consumed: asked once per answer)."""
    if not _early:
        return False
    known = _id(request)
    return known is not None and _early.pop(known, 0) is None


def sent(request: Any, store: KeyStore, record: str, fence: int) -> None:
    """Note a derived answer handed out for `request` (the guard asked `gave_up` first, with
    no await between, so a cancel lands either here or there)."""
    known = _id(request)
    if known is not None:
        _remember(_sent, known, (store, record, fence))


def handed_first(request: Any, record: str) -> None:
    """`record`'s answer goes to `request`'s caller, which had none it kept (an execution's,
    or a replay of one its caller gave up on): note the other requests already received on the
    connection, sent before that caller could see it."""
    connection = connection_of(request)
    if connection is None:
        return
    for request_id in in_flight_with(request):
        if not isinstance(request_id, bool):
            key = (connection, request_id)
            _remember(_before, key, _before.get(key, frozenset()) | {record})


def received_before(request: Any, record: str) -> bool:
    """Whether `request` had been received when an answer of `record` first reached its
    caller (`handed_first`): it was sent before that answer could be seen, so it is a re-send
    (or a twin), never a deliberate repeat (rule 15)."""
    if not _before:
        return False
    known = _id(request)
    return known is not None and record in _before.get(known, ())


def answered(request: Any, record: str) -> bool:
    """Whether this very request (its connection and id) was already answered from `record`:
    the same JSON-RPC message delivered twice (MCP forbids a requestor to reuse an id within a
    session, so a second request with it is a duplicate, never a new call)."""
    if not _sent:
        return False
    known = _id(request)
    found = _sent.get(known) if known is not None else None
    return found is not None and found[1] == record


def received_elsewhere(request: Any, record: str, fence: int) -> bool:
    """Whether another request on `request`'s connection was handed the same answer (the
    record's execution `fence`): a client that dispatched twice and gave up on one copy still
    received the answer, so it is not marked undelivered. Asked only before an `abandon`."""
    known = _id(request)
    return known is not None and _elsewhere(known, record, fence)


def _elsewhere(known: tuple[str, object], record: str, fence: int) -> bool:
    return any(
        key[0] == known[0] and key != known and found[1:] == (record, fence)
        for key, found in _sent.items()
    )


async def cancelled(request: Any, params: Mapping[str, Any] | None) -> None:
    """A `notifications/cancelled` arrived (`request`: its SDK context, `params`: its raw
    params). If it names an answer already handed out on the same connection, mark that answer
    undelivered; if it names none, remember it for the guard (`gave_up`). Never raises."""
    if not isinstance(params, Mapping):
        return
    connection = connection_of(request)
    request_id = params.get("requestId")
    if connection is None or request_id is None or isinstance(request_id, bool):
        return
    found = _sent.pop((connection, request_id), None)
    if found is None:
        _remember(_early, (connection, request_id), None)
        return
    store, record, fence = found
    if _elsewhere((connection, request_id), record, fence):
        return
    marked = marking[record] = anyio.Event()
    try:
        with anyio.CancelScope(shield=True):
            await store.abandon(record, fence)
    except Exception as exc:
        logger.warning(
            "could not mark the answer of record %s undelivered after a late cancel: %r; the"
            " caller's re-send of it runs again",
            record_name(record),
            exc,
        )
    finally:
        marked.set()
        if marking.get(record) is marked:
            del marking[record]


async def settled(record: str) -> None:
    """Wait until a late cancel's mark on `record` is written, if one is being written."""
    pending = marking.get(record)
    if pending is not None:
        await pending.wait()
