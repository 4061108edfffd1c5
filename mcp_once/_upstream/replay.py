"""The proxy's previous answers to `initialize` and the first `tools/list`, replayed when provably
the same (issue 46, item 3).

Why: a stdio proxy's start-up is its imports (FastMCP and what it stands on: ~1.2 s of CPU) and
its upstream's own start, overlapped (`early.py`); the imports cannot be cut from our side
(benchmarks/README.md, "Start-up"). What can be done is not to wait for them: when everything the
two answers depend on is byte-identical to a previous start's, the answers FastMCP gave then are
the answers it would give now. So the proxy keeps them, after its first listing, in
`<state folder>/<stem>.replay` (beside the upstream's manifest and default store), with
what they were computed from:

- `static`: a digest of the versions, sources, command line, option files and environment the
  answers depend on (`inputs.py` lists them);
- the caller's `initialize` and first `tools/list` messages as sent (canonical JSON, without
  the id);
- the lines the upstream link's SDK session sent the child (`initialize`, `notifications/
  initialized`, the first `tools/list`), and digests of the child's raw results to them.

On a start whose `static` matches and whose caller's first line is that same `initialize`, the
proxy (anyio and json only, before FastMCP is imported) sends the child the link's stored lines
and reads its answers; when their digests match too it writes the stored `initialize` answer with
the caller's id, and the stored `tools/list` answer once the caller asks the same again
(after its `notifications/initialized`). Every line the caller sends is queued for the stdio
front, which feeds them to FastMCP once it is up, the two answered requests under ids of our own
(`OURS`): FastMCP's answers to them are compared with what was sent and dropped. Equal is the
proof; unequal is logged as an error naming where they differ, and the file is deleted. The link
adopts the handshake the child already made (`mcp_once.proxy.adopted`): no second `initialize`.

Anything else (no file, other inputs, another first message, a child that fails or answers
otherwise) takes the normal path, and the file is written again from what that start saw. A
child that failed during the replay is stopped, and the link starts one the usual way.
`MCP_ONCE_REPLAY=0` turns replaying and recording off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process

from .fdio import Lines, read_some, write_all
from .inputs import SWITCH, Static, eligible, enabled, static_inputs

__all__ = [
    "OURS",
    "SUFFIX",
    "SWITCH",
    "Start",
    "Static",
    "current",
    "eligible",
    "enabled",
    "static_inputs",
]

logger = logging.getLogger("mcp_once.proxy")

#: Bumped if what is stored or how it is compared ever changes.
_VERSION = "mcp-once-replay/1"
#: The replay file's suffix, after the upstream's stem (`identity.py`).
SUFFIX = ".replay"  # JSON, but not `*.json`: the manifests are (`mcp-once proxy --list`)
#: How long the caller's first line is waited for before the normal path goes on without it.
_FIRST_LINE_WAIT = 2.0
#: How long the child gets to answer the stored `initialize` and `tools/list` (each).
_CHILD_WAIT = 30.0
#: The ids under which the replayed requests are fed to FastMCP (one the caller cannot expect).
OURS = {"initialize": "mcp-once-replay:initialize", "tools/list": "mcp-once-replay:tools/list"}
#: A caller's id whose JSON form is the same in json and pydantic (replayed only then).
_PLAIN_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _message(line: bytes) -> dict[str, Any] | None:
    try:
        found = json.loads(line)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


#: W3C trace context a traced caller puts in every request's `_meta` (the SDK's client does,
#: with a tracer provider set): new with each request, and nothing FastMCP's answers are made
#: of, so not part of what a caller's message is compared by (else a traced caller would never
#: be replayed). What was sent is still checked against FastMCP's answer on every replay.
_TRACE_CONTEXT = ("traceparent", "tracestate", "baggage")


def _without_id(message: dict[str, Any]) -> str:
    """`message` as two starts' callers' messages are compared: without its id and the trace
    context in its `_meta`."""
    found = {k: v for k, v in message.items() if k != "id"}
    params = found.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(params, dict) and isinstance(meta, dict):
        meta = {k: v for k, v in meta.items() if k not in _TRACE_CONTEXT}
        found["params"] = (
            {**params, "_meta": meta} if meta else {k: v for k, v in params.items() if k != "_meta"}
        )
    return _canonical(found)


def _plain(request_id: object) -> bool:
    if isinstance(request_id, bool):
        return False
    return isinstance(request_id, int) or (
        isinstance(request_id, str) and _PLAIN_ID.fullmatch(request_id) is not None
    )


def _with_id(line: str, old: str, new: object) -> str:
    """`line` (a JSON-RPC answer as the front writes it: `jsonrpc` first, then `id`) with its id
    (`old`, as JSON) replaced by `new`."""
    return line.replace(f'"id":{old}', f'"id":{json.dumps(new)}', 1)


def _where(sent: str, given: str) -> str:
    """Where two answers differ, as a path of keys (no values: they may hold the listing)."""
    a: Any = _message(sent.encode())
    b: Any = _message(given.encode())
    path: list[str] = []
    while isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        differing = [k for k in keys if a.get(k) != b.get(k)]
        if not differing:
            break
        path.append(differing[0])
        a, b = a.get(differing[0]), b.get(differing[0])
    return "/".join(path) or "(formatting)"


class Start:
    """This start's replay: the stored answers (if any), the caller's lines read early, and what
    is recorded for the next start."""

    def __init__(self, path: Path, static: Static) -> None:
        self.path = path
        self.static = static
        self.stored = self._load()
        #: The caller's lines read early, in order (the replayed requests under `OURS` ids).
        self.queued: list[bytes] = []
        self._caller = Lines(functools.partial(read_some, 0))
        #: The child's `initialize` result, when this start made its handshake (link adopts it).
        self.handshake: dict[str, Any] | None = None
        #: Answers sent early, by the id FastMCP answers under: (the caller's id, the line sent).
        self.answered: dict[str, tuple[object, str]] = {}
        #: What this start saw, for the next one's file (written once all of it is there).
        self.parts: dict[str, str] = {}
        #: Whether all of it was seen and the file is to be written (`record`, by the front).
        self.due = False
        self._recording = True
        self._caller_ids: dict[str, object] = {}
        self._link_ids: dict[str, object] = {}
        self._child: Lines | None = None  # the child's stdout, once asked
        self._tapped = b""
        self._compared: anyio.Event | None = None  # made in the event loop, at the first answer

    def _load(self) -> dict[str, Any] | None:
        try:
            stored = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(stored, dict) or stored.get("version") != _VERSION:
            return None
        if not all(isinstance(stored.get(k), str) for k in _STORED):
            return None
        return stored

    # -- before FastMCP: the caller's first lines, the child's handshake --------------------

    async def _caller_line(self, wait: float | None) -> bytes | None:
        """The caller's next line (queued as read), None at EOF or after `wait` seconds."""
        with anyio.move_on_after(wait):
            return await self._caller.line(last=False)
        return None

    async def answer(self, process: Process) -> bool:
        """Answer the caller's `initialize` and first `tools/list` from the file, if this start
        is provably the same as the one that wrote it (see the module doc). False when the
        child failed under it (the caller then stops it: the link starts one the usual way)."""
        stored = self.stored
        if stored is None or stored["static"] != self.static.digest():
            return True
        line = await self._caller_line(_FIRST_LINE_WAIT)
        message = None if line is None else _message(line)
        if line is None or message is None:
            self._queue(line)
            return True
        if message.get("method") != "initialize" or not _plain(message.get("id")):
            self._queue(line)
            return True
        if _without_id(message) != stored["caller_initialize"]:
            self._queue(line)
            return True
        try:
            with anyio.fail_after(_CHILD_WAIT):
                child_init = await self._ask(process, stored["link_initialize"])
                self.handshake = child_init
                await self._tell(process, stored["link_initialized"])
                self.parts |= {k: stored[k] for k in ("link_initialize", "link_initialized")}
                self.parts["child_initialize"] = _sha(_canonical(child_init))
                if self.parts["child_initialize"] != stored["child_initialize"]:
                    self._queue(line)
                    return True
                child_list = await self._ask(process, stored["link_list"])
        except (
            TimeoutError,
            OSError,
            ValueError,
            KeyError,
            TypeError,
            anyio.EndOfStream,
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
        ):
            logger.debug("replay: the child failed its handshake; started again the usual way")
            self.handshake = None
            self._queue(line)
            with contextlib.suppress(OSError):
                self.path.unlink()  # not tried again until a start records it anew
            return False
        if _sha(_canonical(child_list)) != stored["child_list"]:
            self._queue(line)
            return True
        # Provably the same start: the stored answers are FastMCP's answers to this one.
        self._recording = False
        caller_id = message["id"]
        await self._send(stored["initialize_answer"], stored["initialize_id"], caller_id)
        self._ours(message, "initialize", caller_id, stored)
        await self._answer_list(stored)
        return True

    async def _answer_list(self, stored: dict[str, Any]) -> None:
        """After the replayed `initialize`: queue the caller's `notifications/initialized`, and
        answer its `tools/list` if it is the one stored (anything else first: FastMCP answers)."""
        line = await self._caller_line(None)
        message = None if line is None else _message(line)
        if line is None or message is None or message.get("method") != "notifications/initialized":
            self._queue(line)
            return
        self._queue(line)
        line = await self._caller_line(None)
        message = None if line is None else _message(line)
        if line is None or message is None or message.get("method") != "tools/list":
            self._queue(line)
            return
        caller_id = message.get("id")
        if not _plain(caller_id) or _without_id(message) != stored["caller_list"]:
            self._queue(line)
            return
        await self._send(stored["list_answer"], stored["list_id"], caller_id)
        self._ours(message, "tools/list", caller_id, stored)

    def _queue(self, line: bytes | None) -> None:
        if line is not None:
            self.queued.append(line)

    def _ours(self, message: dict[str, Any], method: str, caller_id: object, stored: Any) -> None:
        """Queue the answered request for FastMCP under our id, and note what was sent."""
        ours = OURS[method]
        key = "initialize" if method == "initialize" else "list"
        sent = _with_id(stored[f"{key}_answer"], stored[f"{key}_id"], caller_id)
        self.answered[ours] = (caller_id, sent)
        if self._compared is None:
            self._compared = anyio.Event()
        self.queued.append(json.dumps({**message, "id": ours}).encode())

    async def _send(self, answer: str, old: str, caller_id: object) -> None:
        await write_all(1, (_with_id(answer, old, caller_id) + "\n").encode())

    async def _tell(self, process: Process, line: str) -> None:
        assert process.stdin is not None
        await process.stdin.send((line + "\n").encode())

    async def _ask(self, process: Process, line: str) -> dict[str, Any]:
        """Send the child `line` (a request) and return its answer's `result`; what it writes
        before (log notifications, which no caller would have got: none is in flight) is
        dropped; a request or an error is a failure (ValueError)."""
        assert process.stdout is not None
        if self._child is None:
            self._child = Lines(process.stdout.receive)  # EOF: EndOfStream, a failure
        await self._tell(process, line)
        wanted = json.loads(line)["id"]
        while True:
            raw = await self._child.line(last=False)
            if raw is None:  # not from anyio's streams (they raise at EOF), but said the same
                raise anyio.EndOfStream
            found = _message(raw)
            if found is None or ("method" in found and "id" in found):
                raise ValueError("the child sent a request or a line that is not JSON")
            if "method" in found:
                continue
            if found.get("id") != wanted or not isinstance(found.get("result"), dict):
                raise ValueError("the child answered something else")
            result: dict[str, Any] = found["result"]
            return result

    async def compared(self) -> None:
        """Return once FastMCP's answers to the requests answered early were compared (bounded:
        `_CHILD_WAIT`). The front waits for this at the caller's EOF: a caller that has its
        answers may close its end at once (a listing client does), and the session's end would
        otherwise fail the requests still queued to FastMCP, which is no proof of anything."""
        if self.answered and self._compared is not None:
            with anyio.move_on_after(_CHILD_WAIT):
                await self._compared.wait()

    def handed_over(self) -> tuple[list[bytes], bytes]:
        """What the front reads first: the caller's lines read here (queued), in order, then
        what was read past them (whole lines too, and the start of the next)."""
        return self.queued, self._caller.rest

    @property
    def child_rest(self) -> bytes:
        """What the child wrote past the answers read here (the link reads it first)."""
        return b"" if self._child is None else self._child.rest

    # -- the normal path: what the caller, the link and FastMCP said, recorded ---------------

    def from_caller(self, line: bytes) -> None:
        """Note a line the caller sent (the front calls this for each, until both are seen)."""
        if not self._recording or "list_caller_id" in self._caller_ids:
            return
        message = _message(line)
        if message is None:
            return
        method = message.get("method")
        if "initialize_caller_id" not in self._caller_ids:
            if method != "initialize":
                self._recording = False  # a start the replay would not answer
                return
            self.parts["caller_initialize"] = _without_id(message)
            self._caller_ids["initialize_caller_id"] = message.get("id")
        elif method == "tools/list" and "id" in message:
            self.parts["caller_list"] = _without_id(message)
            self._caller_ids["list_caller_id"] = message.get("id")

    def to_child(self, data: bytes) -> None:
        """Note what the link wrote to the child (the adopted process's stdin)."""
        if not self._recording or "list" in self._link_ids:
            return
        for line in data.split(b"\n"):
            message = _message(line)
            if message is None:
                continue
            method = message.get("method")
            text = line.decode()
            if method == "initialize" and "link_initialize" not in self.parts:
                self.parts["link_initialize"] = text
                self._link_ids["initialize"] = message.get("id")
            elif method == "notifications/initialized" and "link_initialized" not in self.parts:
                self.parts["link_initialized"] = text
            elif method == "tools/list" and "list" not in self._link_ids:
                self.parts["link_list"] = text
                self._link_ids["list"] = message.get("id")

    def from_child(self, data: bytes) -> None:
        """Note what the child wrote (the adopted process's stdout): its two results' digests."""
        if not self._recording or "child_list" in self.parts:
            return
        self._tapped += data
        *lines, self._tapped = self._tapped.split(b"\n")
        for line in lines:
            message = _message(line)
            if message is None or "id" not in message:
                continue
            if "method" in message:
                # A request of the child's (roots/list, sampling) before its first listing: a
                # replay could not answer it; such an upstream is never replayed.
                self._recording = False
                return
            result = message.get("result")
            if message["id"] == self._link_ids.get("initialize") and isinstance(result, dict):
                if "child_initialize" not in self.parts:
                    self.parts["child_initialize"] = _sha(_canonical(result))
            elif "list" in self._link_ids and message["id"] == self._link_ids["list"]:
                if isinstance(result, dict) and result.get("nextCursor") is None:
                    self.parts["child_list"] = _sha(_canonical(result))
                else:
                    self._recording = False  # a paged or failed listing: not replayed

    def to_caller(self, answer_id: object, data: str) -> str | None:
        """What the front writes for `data`, an answer with id `answer_id` (None: not an answer):
        `data`, or None to drop it (FastMCP's answer to a request already answered: compared
        with what was sent)."""
        if isinstance(answer_id, str) and answer_id in self.answered:
            caller_id, sent = self.answered.pop(answer_id)
            given = _with_id(data, json.dumps(answer_id), caller_id)
            if not self.answered and self._compared is not None:
                self._compared.set()
            if given != sent:
                method = next(m for m, ours in OURS.items() if ours == answer_id)
                logger.error(
                    "replay: FastMCP's answer to the caller's %s differs from the one replayed"
                    " from %s (at %s); the file is deleted, the next start answers the usual way",
                    method,
                    self.path,
                    _where(sent, given),
                )
                with contextlib.suppress(OSError):
                    self.path.unlink()
            return None
        if self._recording and answer_id is not None:
            self._note_answer(answer_id, data)
        return data

    def _note_answer(self, answer_id: object, data: str) -> None:
        for key in ("initialize", "list"):
            wanted = self._caller_ids.get(f"{key}_caller_id", _NOTHING)
            if answer_id != wanted or f"{key}_answer" in self.parts:
                continue
            if not data.startswith(f'{{"jsonrpc":"2.0","id":{json.dumps(answer_id)},"result":'):
                self._recording = False  # an error, or a form the replay would not rebuild
                return
            self.parts[f"{key}_answer"] = data
            self.parts[f"{key}_id"] = json.dumps(answer_id)
            if key == "list":
                self._recording = False
                self.due = True

    def record(self) -> None:
        """Write the file (atomically) if everything it needs was seen; else leave it. The
        front calls this once `due`, after writing the first listing's answer: the static
        digest is taken here when no file was there to check (`inputs.Static`), off the path
        of the caller's first answers."""
        self.due = False
        if missing := sorted(set(_STORED) - set(self.parts) - {"static"}):
            logger.debug("replay: not recorded (missing %s)", missing)
            return
        if (static := self.static.digest()) is None:
            logger.debug("replay: not recorded (the installation changed during the start)")
            return
        self.parts["static"] = static
        stored = {"version": _VERSION, **{k: self.parts[k] for k in _STORED}}
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            temporary.write_text(json.dumps(stored))
            os.replace(temporary, self.path)
        except OSError as exc:
            logger.debug("replay: cannot write %s (%s)", self.path, exc)
            with contextlib.suppress(OSError):
                temporary.unlink()


_NOTHING = object()

#: What a replay file holds (besides its version), each a string.
_STORED: Sequence[str] = (
    "static",
    "caller_initialize",
    "caller_list",
    "link_initialize",
    "link_initialized",
    "link_list",
    "child_initialize",
    "child_list",
    "initialize_answer",
    "initialize_id",
    "list_answer",
    "list_id",
)

#: This process's start, when its front and upstream are ones a replay serves (set by the CLI).
current: Start | None = None
