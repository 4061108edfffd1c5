"""A stored record's bytes read in Python, for listings: the layout `scripts/lib.lua` writes.

Why a second reader beside `lib.lua`'s `decode`: the scripts read one record at a time, each
calling TIME, which is right for a transition and wrong for an operator listing thousands. A
listing instead GETs the records it needs, pipelined (`RedisKeyStore.list_records`), reads the
clock once, and decodes them here, so that the Redis server spends no Lua on an operator's
listing. The two readers must agree on every record and every refusal: the contract tests read
each damaged record through both (`tests/store/test_redis_store.py`), and `lib.lua` names this
module beside its layout.

`of_fields` builds the `Record` from the fields either reader found (the READ script's reply
carries the same ones), so that one place maps slots to fields.
"""

from __future__ import annotations

import struct
from typing import Final

from ..store import CorruptRecord, Record, RecordState

#: `>BBi8i8i8i8i8i8i8`: format, state, fence, attempts, created, updated, lease, completed,
#: expires (microseconds of the Redis clock; 0 = none).
_HEAD: Final = struct.Struct(">BBqqqqqqq")
_FORMATS: Final = (1, 2, 3)
_WITH_TOOL: Final = 2
#: A record carrying its own history (rule 24), after its tool name.
_WITH_HISTORY: Final = 3
_HISTORY_LENGTH: Final = struct.Struct(">I")
_TOKEN_BYTES: Final = 32
STATES: Final = {
    1: RecordState.IN_PROGRESS,
    2: RecordState.COMPLETED,
    3: RecordState.UNKNOWN,
    4: RecordState.RELEASED,
}
#: Each state's code, the record's second byte.
CODES: Final = {state: code for code, state in STATES.items()}
#: A COMPLETED record's delivery mark, in its lease slot (scripts/lib.lua).
DELIVERED: Final = 1


def decode(key: str, raw: bytes) -> Record:
    """The record stored as `raw`, expired or not, or `CorruptRecord` with the reason `lib.lua`
    gives for the same bytes. A format-3 record comes with its history (`Record.history`; None
    for formats 1 and 2, whose history, if any, is a key beside them): a listing reads both in
    one MGET."""
    size = len(raw)
    if size < _HEAD.size + 3:
        raise CorruptRecord(key, "shorter than a record header")
    version, state, fence, attempts, created, updated, lease, completed, expires = (
        _HEAD.unpack_from(raw)
    )
    if version not in _FORMATS:
        raise CorruptRecord(key, f"unknown record format {version}")
    at = _HEAD.size
    fp_length = int.from_bytes(raw[at : at + 2], "big")
    at += 2
    if at + fp_length >= size:
        raise CorruptRecord(key, "truncated fingerprint")
    fingerprint = raw[at : at + fp_length]
    at += fp_length
    token_length = raw[at]
    at += 1
    if at + token_length > size:
        raise CorruptRecord(key, "truncated token")
    token = raw[at : at + token_length]
    at += token_length
    tool = b""
    history = None
    if version != 1:
        name_length = raw[at] if at < size else -1
        if (
            name_length < 0
            or (name_length == 0 and version == _WITH_TOOL)
            or at + name_length >= size
        ):
            raise CorruptRecord(key, "truncated tool name")
        tool = raw[at + 1 : at + 1 + name_length]
        at += 1 + name_length
    if version == _WITH_HISTORY:
        if at + _HISTORY_LENGTH.size > size:
            raise CorruptRecord(key, "truncated history")
        (history_length,) = _HISTORY_LENGTH.unpack_from(raw, at)
        at += _HISTORY_LENGTH.size
        if at + history_length > size:
            raise CorruptRecord(key, "truncated history")
        history = raw[at : at + history_length]
        at += history_length
    result = raw[at:]
    if state not in STATES:
        raise CorruptRecord(key, f"unknown state {state}")
    if fence < 1 or attempts < 1 or created <= 0 or updated <= 0:
        raise CorruptRecord(key, "fence, attempts or timestamps out of range")
    running = state == 1
    if running != (token_length == _TOKEN_BYTES) or (not running and token_length != 0):
        raise CorruptRecord(key, "token does not match the state")
    if (state == 3 and expires != 0) or (state in (2, 4) and expires == 0):
        raise CorruptRecord(key, "expiry does not match the state")
    if running:
        expires = 0  # kept until it ends, whatever expiry it was stored with (lib.lua: NEVER)
    if (running and lease <= 0) or (state == 2 and completed <= 0):
        raise CorruptRecord(key, "deadline missing for the state")
    if state != 2 and result:
        raise CorruptRecord(key, "result stored in a record that is not completed")
    return of_fields(
        key, state, fence, attempts, created, updated, lease, completed, expires,
        fingerprint, token, result, tool, history,
    )  # fmt: skip


def of_fields(
    key: str, state: int, fence: int, attempts: int, created: int, updated: int, lease: int,
    completed: int, expires: int, fingerprint: bytes, token: bytes, result: bytes, tool: bytes,
    history: bytes | None = None,
) -> Record:  # fmt: skip
    """The `Record` of a stored record's fields (times in microseconds, 0 for none), and its
    history when it was read with it."""
    record_state = STATES[state]
    done = record_state is RecordState.COMPLETED
    return Record(
        key=key,
        state=record_state,
        fingerprint=unpack_fingerprint(fingerprint),
        fence=fence,
        attempts=attempts,
        token=token.decode(errors="replace") or None,
        created_at=created / 1_000_000,
        updated_at=updated / 1_000_000,
        # A completed record's lease slot is its delivery mark (scripts/lib.lua).
        lease_deadline=None if done or lease == 0 else lease / 1_000_000,
        completed_at=None if completed == 0 else completed / 1_000_000,
        expires_at=None if expires == 0 else expires / 1_000_000,
        result=result if done else None,
        tool=tool.decode(errors="replace") or None,
        delivered=done and lease == DELIVERED,
        history=None if history is None else history.decode(errors="replace"),
    )


def pack_fingerprint(fingerprint: str) -> bytes:
    """A SHA-256 hex digest (what the server layer sends) is stored as its 32 raw bytes behind
    0xFF, a byte UTF-8 never contains; anything else as UTF-8. Saves 31 bytes per record."""
    if len(fingerprint) == 64:
        try:
            raw = bytes.fromhex(fingerprint)
        except ValueError:
            return fingerprint.encode()
        # fromhex also reads upper case and skips spaces: only what hex() gives back is packed
        if raw.hex() == fingerprint:
            return b"\xff" + raw
    return fingerprint.encode()


def unpack_fingerprint(stored: bytes) -> str:
    if len(stored) == 33 and stored[0] == 0xFF:
        return stored[1:].hex()
    return stored.decode(errors="replace")
