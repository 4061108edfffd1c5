"""The pure pieces of the guard: fingerprints, stored-result encoding, key derivation, policy."""

from __future__ import annotations

import json
from typing import get_args

import pytest
from mcp_types import CallToolResult, TextContent

from idempotency import (
    KeyMode,
    Policy,
    UnreadableResult,
    decode_result,
    encode_result,
    fingerprint,
    rfc3339,
    store_key,
    wire,
)
from idempotency._guard.mint import derive_key, input_round, meta_inputs
from idempotency._guard.replay import domain_form, stamped


def test_fingerprint_is_canonical_and_tells_calls_apart() -> None:
    a = fingerprint("t", {"b": [1, {"y": 2, "x": 1}], "a": "é"})
    b = fingerprint("t", {"a": "é", "b": [1, {"x": 1, "y": 2}]})
    assert a == b and len(a) == 64
    assert fingerprint("t", None) == fingerprint("t", {})
    assert fingerprint("t", {"n": 1}) != fingerprint("t", {"n": 1.5})
    assert fingerprint("t", {"n": 1}) != fingerprint("u", {"n": 1})


def test_store_keys_and_derived_keys_are_hashed_and_valid() -> None:
    assert store_key("scope-a", "t", "k") != store_key("scope-b", "t", "k")
    assert store_key("s", "t", "k") != store_key("s", "u", "k")
    assert "k" not in store_key("s", "t", "k") and len(store_key("s", "t", "k")) == 64
    fp = "f" * 64

    def derived(scope: str = "s", caller: str = "c", rounds: dict[str, str] | None = None) -> str:
        return derive_key(scope, "t", fp, caller=caller, round_fields=rounds)

    assert wire.key_problem(derived()) is None and derived() == derived()
    assert derived() != derived(scope="other")
    # Bound to its caller (rule 7), and a completing input round is a call of its own.
    assert derived() != derived(caller="another caller")
    assert derived() != derived(rounds={"requestState": "r1"})
    assert derived(rounds={"requestState": "r1"}) != derived(rounds={"requestState": "r2"})


def test_input_round_fields_are_read_from_the_raw_params() -> None:
    assert input_round(None) is None
    assert input_round({"name": "t", "arguments": {}}) is None
    assert input_round({"name": "t", "requestState": None}) is None
    answers = {"q": {"action": "accept"}}
    assert input_round({"name": "t", "inputResponses": answers, "requestState": "s"}) == {
        "inputResponses": answers,
        "requestState": "s",
    }


def test_key_modes_are_the_wire_contracts() -> None:
    assert get_args(KeyMode) == wire.KEY_MODES


def test_stored_results_are_domain_form_without_our_marker() -> None:
    result = CallToolResult(
        content=[TextContent(type="text", text="ok")],
        structured_content={"v": 1},
        meta={"example.com/x": 1},
    )
    marked = stamped(
        result, key="k", key_source="client", status="executed", executed_at=1.5, attempts=1
    )
    data = encode_result(marked, 1.5)
    payload = json.loads(data)
    assert payload["result"] == {
        "_meta": {"example.com/x": 1},
        "content": [{"type": "text", "text": "ok"}],
        "structuredContent": {"v": 1},
        "isError": False,
    }
    assert "resultType" not in payload["result"]
    decoded = decode_result(data)
    assert decoded.executed_at == 1.5
    assert decoded.result.meta == {"example.com/x": 1}


@pytest.mark.parametrize(
    "result",
    [
        CallToolResult(content=[TextContent(type="text", text="x" * 200)]),
        CallToolResult(
            content=[TextContent(type="text", text='é\u2028\x00\x7f"\\</')],
            structured_content={
                "floats": [1e16, 0.1, -0.0, 1.5e-05, 5e-324, 1.7976931348623157e308],
                "big": 2**80,
                "none": None,
                "nested": {"1": [True, None, "ü"]},
            },
            meta={"example.com/x": {"y": [1, 2]}},
        ),
        CallToolResult(content=[], is_error=True),
    ],
)
@pytest.mark.parametrize("executed_at", [1_764_624_000.123456, 1.5, 1])
def test_stored_results_read_back_as_the_domain_form_encoded_by_json(
    result: CallToolResult, executed_at: float
) -> None:
    """`encode_result` writes the common case with pydantic-core: the same JSON value as the
    domain form encoded by `json` (the bytes may spell some floats differently)."""
    data = encode_result(result, executed_at)
    by_json = {
        "format": "mcp-once/result@1",
        "executedAt": executed_at,
        "result": domain_form(result),
    }
    assert json.loads(data) == by_json
    assert json.loads(data)["executedAt"] == executed_at
    assert decode_result(data).result == result


def test_stored_non_finite_floats_are_written_as_the_domain_form_has_them() -> None:
    result = CallToolResult(content=[], structured_content={"v": [float("nan"), float("-inf")]})
    by_json = json.dumps(domain_form(result), separators=(",", ":"))
    assert encode_result(result, 1.5).endswith(f',"result":{by_json}}}'.encode())


@pytest.mark.parametrize(
    "data",
    [b"\xff", b"[]", b'{"format": "other"}', b'{"format": "mcp-once/result@1", "result": 5}'],
)
def test_foreign_payloads_are_refused(data: bytes) -> None:
    with pytest.raises(UnreadableResult):
        decode_result(data)


def test_rfc3339_is_utc_with_z() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"


def test_takeover_auto_follows_the_authors_declaration() -> None:
    assert Policy().takeover_for(False) is False
    assert Policy().takeover_for(True) is True
    assert Policy(naturally_idempotent=True).takeover_for(False) is True
    assert Policy(takeover=False).takeover_for(True) is False
    assert Policy(takeover=True).takeover_for(False) is True
    assert Policy().advertised(True) == {"keys": "derived", "retentionSeconds": 86400}


@pytest.mark.parametrize(
    ("keys", "caller_known", "protected", "advertised"),
    [
        ("derived", True, True, "derived"),
        ("derived", False, False, "optional"),
        ("optional", True, False, "optional"),
        ("optional", False, False, "optional"),
        ("required", True, True, "required"),
        ("required", False, True, "required"),
    ],
)
def test_what_is_promised_to_a_keyless_caller(
    keys: KeyMode, caller_known: bool, protected: bool, advertised: str
) -> None:
    policy = Policy(keys=keys)
    assert policy.keyless_protected(caller_known) is protected
    assert policy.advertised(caller_known)["keys"] == advertised


def test_a_derived_key_holds_the_meta_a_tool_may_read_and_not_what_a_resend_changes() -> None:
    fp = "f" * 64

    def derived(meta: dict[str, object] | None) -> str:
        return derive_key("s", "t", fp, caller="c", round_fields=None, meta=meta)

    plain = derived(None)
    # Per send by design, or the protocol's and mcp-once's own: the same call.
    for meta in (
        {},
        {"progressToken": 3},
        {"progress_token": 4, "traceparent": "00-a-b-01", "tracestate": "x", "baggage": "y"},
        {"io.modelcontextprotocol/clientInfo": {"name": "c"}},
        {wire.KEY_META + "-not-a-key": 1, wire.ATTEMPT_META: 2},
    ):
        assert meta_inputs(meta) is None and derived(meta) == plain, meta
    # The caller's input: another call.
    assert derived({"user_id": "ann"}) != plain
    assert derived({"user_id": "ann"}) != derived({"user_id": "bob"})
    assert derived({"user_id": "ann", "progressToken": 1}) == derived({"user_id": "ann"})


@pytest.mark.parametrize(
    "answer",
    [
        CallToolResult(content=[TextContent(type="text", text="7")]),
        CallToolResult(
            content=[TextContent(type="text", text='{"n": 7}')],
            structured_content={"n": 7, "items": [{"id": 1.5, "tags": ["a"]}, None]},
            is_error=True,
            _meta={"io.github.mcp-once/idempotency": {"status": "replayed"}, "other": 1},  # type: ignore[call-arg]
        ),
    ],
)
def test_the_guards_answer_reaches_fastmcp_as_from_mcp_result_carries_it(
    answer: CallToolResult,
) -> None:
    """`as_tool_result` (the guard's answers to FastMCP, the proxy's upstream results) skips
    `ToolResult`'s constructor (a walk of the structured content per call) but must carry what
    `ToolResult.from_mcp_result` carries: the same fields, and the answer itself as the wire
    form (FastMCP's private `_raw_mcp_result`: renamed by a FastMCP release, this fails instead
    of replays losing their exact form)."""
    from fastmcp.tools.base import ToolResult

    from idempotency.fastmcp import as_tool_result

    ours, theirs = as_tool_result(answer), ToolResult.from_mcp_result(answer)
    assert ours.to_mcp_result() is answer
    assert theirs.to_mcp_result() is answer
    assert ours.model_dump() == theirs.model_dump()
    assert type(ours) is type(theirs)
    # Built past pydantic's constructor: the state `model_construct` gives, the wire form set.
    constructed = ToolResult.model_construct(
        content=answer.content,
        structured_content=answer.structured_content,
        meta=answer.meta,
        is_error=answer.is_error,
    )
    constructed._raw_mcp_result = answer
    for state in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__"):
        assert getattr(ours, state) == getattr(constructed, state), state
    assert ours.__pydantic_private__ == constructed.__pydantic_private__
    assert ours == constructed and ours.model_copy() == constructed


def test_a_tool_result_goes_back_to_the_wire_as_fastmcp_puts_it() -> None:
    """`as_call_tool_result` (the guard's reading of FastMCP's chain, the proxy's answer to the
    wire) gives what `ToolResult.to_mcp_result` gives, as a `CallToolResult`: the kept wire form
    itself, read without pydantic's `__getattr__`; FastMCP's conversion of a result without one;
    a subclass's own `to_mcp_result` where it has one."""
    from fastmcp.tools.base import ToolResult

    from idempotency.fastmcp import as_call_tool_result, as_tool_result

    answer = CallToolResult(content=[TextContent(type="text", text="7")], is_error=True)
    assert as_call_tool_result(as_tool_result(answer)) is answer
    plain = ToolResult(content="7", structured_content={"n": 7})
    assert as_call_tool_result(plain) == CallToolResult(
        content=[TextContent(type="text", text="7")], structured_content={"n": 7}
    )
    text_only = ToolResult(content="7")
    assert as_call_tool_result(text_only) == CallToolResult(
        content=[TextContent(type="text", text="7")]
    )

    class Own(ToolResult):
        def to_mcp_result(self) -> CallToolResult:  # type: ignore[override]
            return CallToolResult(content=[TextContent(type="text", text="own")])

    own = Own(content="7")
    own._raw_mcp_result = answer
    assert as_call_tool_result(own).content == [TextContent(type="text", text="own")]


def test_a_result_is_told_from_a_task_without_dumping_it_only_where_its_class_allows() -> None:
    """`tasks.task_payload` skips the dump (a walk of the whole result, structured content
    included, on every guarded call) only for a model whose class says its dump cannot name a
    task; it finds every task the dump finds."""
    from typing import Any

    from fastmcp.tools.base import ToolResult
    from pydantic import BaseModel, ConfigDict, Field, model_serializer

    from idempotency import TaskCreated
    from idempotency._guard import tasks

    def by_dump(value: BaseModel) -> dict[str, Any] | None:
        dumped = value.model_dump(by_alias=True, mode="json", exclude_none=True)
        is_task = dumped.get("resultType") == "task" and isinstance(dumped.get("taskId"), str)
        return dumped if is_task else None

    class Extra(BaseModel):
        model_config = ConfigDict(extra="allow")

    class Serialized(BaseModel):
        kind: str = "complete"

        @model_serializer
        def _wire(self) -> dict[str, Any]:
            return {"resultType": "task", "taskId": "t2"}

    class Aliased(BaseModel):
        kind: str = Field(alias="resultType")
        task_id: str = Field(alias="taskId")

    task = {"resultType": "task", "taskId": "t1", "status": "working"}
    text = [TextContent(type="text", text="x")]
    values: list[BaseModel] = [
        ToolResult(content=text, structured_content={"resultType": "task", "taskId": "t"}),
        CallToolResult(content=text),
        CallToolResult.model_validate({"content": [], "resultType": "task", "taskId": "t"}),
        TaskCreated(task),
        Extra.model_validate(task),
        Serialized(),
        Aliased.model_validate(task),
        Aliased.model_validate({**task, "resultType": "complete"}),
    ]
    found = [tasks.task_payload(value) for value in values]
    assert found == [by_dump(value) for value in values]
    assert [payload is not None for payload in found] == [0, 0, 0, 1, 1, 1, 1, 0]
    assert tasks._result_type_of(ToolResult) == tasks._NEVER  # the common case: no dump
    assert tasks._result_type_of(CallToolResult) == "result_type"
