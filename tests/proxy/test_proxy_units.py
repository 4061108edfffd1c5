"""The proxy's parts that need no process: the policy file, the upstream's names, the
classification of its failures, `mcp-once tools`' rows, and the CLI's usage errors (fast tier)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastmcp.exceptions import ToolError
from mcp import MCPError
from mcp_types import Tool, ToolAnnotations

from idempotency import Interrupted, MemoryKeyStore, OutcomeLost, wire
from idempotency._integrations.fastmcp.results import judged
from mcp_once._cli import main
from mcp_once.proxy import PolicyError, Upstream, UpstreamConfigError, load_policy, parse_policy
from mcp_once.proxy.failures import UpstreamNotSent, UpstreamRefused, caller_error
from mcp_once.proxy.forwarding import Forwarding
from mcp_once.proxy.middleware import ProxyGuardMiddleware
from mcp_once.proxy.policy import ProxyPolicy, ToolRule
from mcp_once.proxy.report import row, table


def test_an_unknown_policy_key_is_an_error_naming_it() -> None:
    with pytest.raises(PolicyError, match="key_arg") as caught:
        parse_policy({"tools": {"charge": {"key_arg": "id"}}})
    assert "charge" in str(caught.value)
    with pytest.raises(PolicyError, match="unknown policy key"):
        parse_policy({"server": {}})
    with pytest.raises(PolicyError, match="guard must be true or false"):
        parse_policy({"tools": {"x": {"guard": "no"}}})


def test_exact_names_win_over_globs_and_unmatched_patterns_are_reported() -> None:
    policy = parse_policy(
        {
            "tools": {
                "create_*": {"keys": "required", "upstream_idempotent": True},
                "create_order": {"keys": "optional"},
                "serch": {"guard": False},
            }
        }
    )
    order = policy.for_tool("create_order")
    assert order.options == {"keys": "optional"} and order.upstream_idempotent
    assert order.set_by == ("create_*", "create_order")
    assert policy.for_tool("search").guard is None
    assert policy.unmatched(["create_order", "search"]) == ["serch"]


def test_read_only_tools_pass_through_unless_the_policy_says_otherwise() -> None:
    plain = parse_policy({}).for_tool("t")
    assert plain.guarded(read_only=True) is False and plain.guarded(read_only=False) is True
    forced = parse_policy({"tools": {"t": {"guard": True}}}).for_tool("t")
    assert forced.guarded(read_only=True) is True


def test_policy_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "p.toml"
    bad.write_text("[tools.x\n")
    with pytest.raises(PolicyError, match="not valid TOML"):
        load_policy(bad)
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "missing.toml")


def test_a_bad_guard_option_fails_at_start_up_before_any_listing() -> None:
    """Checked as the file is read (so `tools` refuses what the proxy would), and again as the
    guard is built for a policy made in Python, never at the first listing: with an upstream
    unreachable while the proxy starts, that listing may come much later."""
    for pattern in ("charge", "charge_*"):
        with pytest.raises(PolicyError, match="sometimes") as caught:
            parse_policy({"tools": {pattern: {"keys": "sometimes"}}})
        assert f'[tools."{pattern}"]' in str(caught.value)
        made = ProxyPolicy((ToolRule(pattern, options={"keys": "sometimes"}),))
        with pytest.raises(ValueError, match="sometimes"):
            ProxyGuardMiddleware(MemoryKeyStore(), made)


def test_upstreams_from_a_desktop_config(tmp_path: Path) -> None:
    config = tmp_path / "claude_desktop_config.json"
    servers = {
        "memory": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-memory"],
            "env": {"A": "1"},
        },
        "remote": {"url": "https://example.test/mcp", "headers": {"X": "y"}},
    }
    config.write_text(json.dumps({"mcpServers": servers}))
    memory = Upstream.from_config(config, "memory")
    assert memory.command == ("npx", "-y", "@modelcontextprotocol/server-memory")
    assert memory.env == {"A": "1"} and memory.name == "memory"  # the entry's name
    assert Upstream.from_config(config, "remote").url == "https://example.test/mcp"
    with pytest.raises(UpstreamConfigError, match="memory, remote"):
        Upstream.from_config(config, "nope")


def test_upstream_failures_as_the_caller_sees_them() -> None:
    refusal = MCPError(-32602, "bad amount", {"field": "amount"})
    wrapped = ToolError("Error calling tool 'charge'")
    wrapped.__cause__ = UpstreamRefused(refusal)
    passed = caller_error(wrapped)
    assert passed is not None
    assert (passed.code, passed.message, passed.data) == (-32602, "bad amount", {"field": "amount"})
    unreachable = caller_error(UpstreamNotSent("no child"))
    assert unreachable is not None and unreachable.code == wire.STORE_UNAVAILABLE
    assert caller_error(ValueError("x")) is None


def test_a_tool_saying_interrupted_is_never_stored() -> None:
    """FastMCP wraps what a tool raises; the guard still sees the tool's `Interrupted`."""
    cut = Interrupted("the upstream may have run it")
    wrapped = ToolError("Error calling tool 'charge'")
    wrapped.__cause__ = cut
    assert judged(wrapped, (), body_started=True) is cut


def test_outcome_lost_is_an_interrupted_the_guard_sees_below_fastmcp() -> None:
    """The proxy's maybe-executed failure: found below FastMCP's `ToolError` as itself (so the
    guard turns the record UNKNOWN at once), and still an `Interrupted` (never stored)."""
    lost = OutcomeLost("the upstream may have run it (transport)")
    wrapped = ToolError("Error calling tool 'charge'")
    wrapped.__cause__ = lost
    assert judged(wrapped, (), body_started=True) is lost and isinstance(lost, Interrupted)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_upstream_message_with_several_calls_in_flight_is_forwarded_to_no_one() -> None:
    """A stdio upstream does not say which request a log line or a question belongs to: with
    two calls in flight on its session (or none), no caller gets it (a question is refused to the
    upstream, a log line dropped), where one stash slot would hand it to whichever came last."""
    forwarding = Forwarding()
    handlers = forwarding.client_options()
    first: Any = SimpleNamespace(request_context=object(), _fastmcp=None)
    second: Any = SimpleNamespace(request_context=object(), _fastmcp=None)
    with pytest.raises(MCPError, match="0 calls were in flight"):  # between calls: no one's
        await handlers["sampling_handler"](None, None, None)
    with forwarding.serving(first), forwarding.serving(second):
        assert forwarding.in_flight == 2
        for name in ("sampling_handler", "elicitation_handler", "roots"):
            with pytest.raises(MCPError, match="2 calls were in flight") as caught:
                await handlers[name](None, None, None)
            assert caught.value.code == -32603
        assert await handlers["log_handler"](SimpleNamespace(data="x")) is None
    assert forwarding.in_flight == 0


def _tool(name: str, **hints: bool) -> Tool:
    annotations = ToolAnnotations(**hints) if hints else None
    return Tool(name=name, input_schema={"type": "object"}, annotations=annotations)


def test_tools_rows_say_what_and_why_and_flag_contradictions() -> None:
    policy = parse_policy({"tools": {"search": {"guard": True}}})
    bare = row(_tool("bare"), policy)
    assert bare.action == "guarded" and bare.flags == ["no annotations at all"]
    odd = row(_tool("odd", read_only_hint=True, destructive_hint=True), policy)
    assert odd.action == "pass-through"
    assert "readOnlyHint and destructiveHint contradict each other" in odd.flags
    risky = row(_tool("wipe", destructive_hint=True, idempotent_hint=True), policy)
    assert any("no key place" in flag for flag in risky.flags)
    forced = row(_tool("search", read_only_hint=True), policy)
    assert forced.action == "guarded" and "set by the policy" in forced.why


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["proxy"], "name one upstream"),
        (
            ["proxy", "--upstream", "http://x/mcp", "--", "node", "s.js"],
            "conflicting upstreams: the command 'node' and --upstream http://x/mcp each name one",
        ),
        (
            ["proxy", "--config", "c.json", "--server", "a", "node"],
            "conflicting upstreams: the command 'node' and --config c.json each name one",
        ),
        (["proxy", "--config", "c.json"], "cannot read the config file c.json"),
        (["tools", "--config", "c.json"], "--config FILE names one upstream here"),
        (["proxy", "--server", "a", "--", "node"], "--server names an entry of --config FILE"),
        (["tools", "--listen", "x"], "unrecognized arguments"),
    ],
)
def test_cli_usage_errors(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert said in capsys.readouterr().err


def test_cli_refuses_an_unknown_policy_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools."charge"]\nidempotent = true\n')
    with pytest.raises(SystemExit) as caught:
        main(["proxy", "--policy", str(policy), "--", "node", "server.js"])
    assert caught.value.code == 2
    assert 'unknown policy key(s) in [tools."charge"]: idempotent' in capsys.readouterr().err


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ('keys = "mandatory"', "keys must be one of required, optional, derived; got 'mandatory'"),
        ('retention = "1d"', "retention must be a number of seconds, not str"),
        ("max_run_time = -5", "max_run_time must be a positive, finite number of seconds"),
        ('key_header = "Bad Header"', "Bad Header"),
        ('key_argument = ""', "key_argument"),
        ('fingerprint = {include = "order"}', "fingerprint paths must be a list"),
        ("guard = 1", "guard must be true or false"),
    ],
)
def test_tools_refuses_every_policy_the_proxy_refuses_with_the_same_words(
    table: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One check for both (`load_policy`): `tools` no longer passes a policy (exit 0) that then
    stops the proxy. Checked before anything is started (the command does not exist)."""
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[tools."create_*"]\n{table}\n')
    errors = {}
    for command in ("tools", "proxy"):
        with pytest.raises(SystemExit) as caught:
            main([command, "--policy", str(policy), "--", "no-such-upstream-command"])
        assert caught.value.code == 2, command
        errors[command] = capsys.readouterr().err
    assert errors["tools"] == errors["proxy"]
    assert said in errors["tools"] and '[tools."create_*"]' in errors["tools"], errors
    assert "Traceback" not in errors["tools"]


def test_tools_rows_say_what_each_guard_option_changes() -> None:
    policy = parse_policy(
        {
            "tools": {
                "create_*": {"keys": "required", "key_argument": "request_id"},
                "create_order": {"retention": 3600, "max_run_time": 60},
                "search": {"key_header": "Idempotency-Key", "guard": False},
            }
        }
    )
    order = row(_tool("create_order"), policy)
    assert order.effects == [
        "keys = required: a call without a key is refused (-32602), never run unguarded",
        "key_argument = request_id: a key may come in that argument (added to the listed"
        " input schema, never in the fingerprint)",
        "retention = 3600 s (1 h): a keyed answer is replayed that long (default 86400 s (1 d))",
        "max_run_time = 60 s (1 min): a call still running then is cut short and answered"
        " -32012 (default 300 s (5 min))",
    ]
    assert row(_tool("charge"), policy).effects == []  # no table: the guard's defaults
    passed = row(_tool("search", read_only_hint=True), policy)
    assert passed.effects == ["key_header set, unused: the tool passes through"]
    assert "policy: keys = required" in table([order])
    assert row(_tool("create_order"), policy).as_json()["effects"] == order.effects


def test_a_pattern_matching_no_tool_names_the_nearest_one() -> None:
    policy = parse_policy(
        {"tools": {"chrage": {"guard": True}, "zzz_*": {"guard": True}, "get_*": {}}}
    )
    said = policy.unmatched_said(["charge", "get_balance", "refund"])
    assert said == [
        "policy pattern 'chrage' matches no tool of the upstream; did you mean 'charge'?",
        "policy pattern 'zzz_*' matches no tool of the upstream",
    ]


def test_the_desktop_config_snippets_run_the_proxy() -> None:
    """Each snippet of docs/proxy.md parses, and names `mcp-once proxy ... -- COMMAND`."""
    from proxy_kit import desktop_configs

    from mcp_once._cli import build_parser

    entries = desktop_configs()
    assert len(entries) == 2
    for entry in entries:
        assert entry["command"] == "mcp-once" and entry["args"][0] == "proxy"
        split = entry["args"].index("--")
        assert entry["args"][split + 1 :], "an upstream command after --"
        build_parser().parse_args(entry["args"][:split])  # the options exist as written


def test_the_default_store_is_the_upstreams_own_file_in_the_state_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not in the working directory: `$XDG_STATE_HOME/mcp-once/NAME-ID.sqlite3`."""
    from mcp_once._cli import build_parser
    from mcp_once._cli._proxy import _store_url

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("MCP_ONCE_STORE", raising=False)
    args = build_parser().parse_args(["proxy"])
    identity = Upstream.stdio("npx", "-y", "@modelcontextprotocol/server-memory").identity
    assert identity.stem == f"server-memory-{identity.id}"
    state = tmp_path / "state" / "mcp-once"
    assert _store_url(args, identity.stem) == f"sqlite:///{state}/{identity.stem}.sqlite3"
    assert not (tmp_path / ".mcp-once").exists()
    monkeypatch.setenv("MCP_ONCE_STORE", "memory://")
    assert _store_url(build_parser().parse_args(["proxy"]), identity.stem) == "memory://"


@pytest.mark.parametrize("meta", [None, {"upstream": {"k": 1}}])
@pytest.mark.parametrize(
    "structured", [None, {"n": 7, "items": [{"id": 1.5, "tags": ["a"]}, None], "s": "é"}]
)
def test_an_upstream_result_is_carried_as_the_tool_result_constructor_would_make_it(
    structured: dict[str, Any] | None, meta: dict[str, Any] | None
) -> None:
    """`tools.tool_result` skips `ToolResult`'s constructor (its conversions copy what the
    session already validated as JSON), through the guard's own `as_tool_result`: the fields are
    what `ToolResult.from_mcp_result` gives, and the wire form FastMCP and the guard make of it
    is the upstream's result itself, the same as FastMCP's proxy tool's."""
    from fastmcp.tools.base import ToolResult
    from mcp_types import CallToolResult, TextContent

    from mcp_once.proxy.tools import tool_result

    result = CallToolResult(
        content=[TextContent(type="text", text="x")],
        structured_content=structured,
        is_error=structured is None,
        _meta=meta,  # type: ignore[call-arg]
    )
    ours = tool_result(result)
    theirs = ToolResult.from_mcp_result(result)
    fastmcp_s = ToolResult(
        content=result.content,
        structured_content=result.structured_content,
        meta=result.meta,
        is_error=result.is_error,
    )
    assert isinstance(ours, ToolResult)
    assert ours.model_dump() == theirs.model_dump() == fastmcp_s.model_dump()
    assert ours.to_mcp_result() is result
    wire = fastmcp_s.to_mcp_result()
    if not isinstance(wire, CallToolResult):  # FastMCP's handler makes one of the other shapes
        content, structured_content = wire if isinstance(wire, tuple) else (wire, None)
        wire = CallToolResult(content=content, structured_content=structured_content)
    assert wire == result
