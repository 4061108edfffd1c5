"""Several upstreams on one front, the parts that need no upstream process (fast tier): the
policy's `[servers."<name>"]` sections, the names the front can hold, and the CLI's refusals.
The front itself, with real upstreams, is `test_proxy_gateway.py`."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from mcp.shared.inbound import decode_header_value
from starlette.requests import Request

from mcp_once._cli import main, parse_args
from mcp_once._upstream import check_names
from mcp_once.proxy import PolicyError, Upstream, UpstreamConfigError, parse_policy
from mcp_once.proxy.task_routes import as_sent_upstream

POLICY = {
    "tools": {"create_*": {"keys": "required"}, "create_order": {"retention": 60}},
    "servers": {
        "shop": {"tools": {"create_*": {"guard": False, "keys": "optional"}}},
        "ledger": {"tools": {"charge": {"upstream_idempotent": True}}},
    },
}


def test_a_servers_section_applies_to_its_upstream_only_and_has_the_last_word() -> None:
    policy = parse_policy(POLICY)
    assert policy.servers == ["shop", "ledger"]
    shop = policy.for_server("shop").for_tool("create_order")
    # Its own glob beats the plain tables' exact name, key by key; the rest still applies.
    assert shop.guard is False and shop.options == {"keys": "optional", "retention": 60}
    assert shop.set_by == ("create_*", "create_order", 'servers."shop".tools."create_*"')
    other = policy.for_server("crm").for_tool("create_order")
    assert other.guard is None and other.options == {"keys": "required", "retention": 60}
    assert not policy.for_server("crm").for_tool("charge").upstream_idempotent
    assert policy.for_server("ledger").for_tool("charge").upstream_idempotent
    # A section's pattern that matches nothing is reported with its section.
    assert policy.for_server("ledger").unmatched(["create_order"]) == [
        'servers."ledger".tools."charge"'
    ]


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"servers": []}, '"servers" must be a table'),
        ({"servers": {"a": {"tool": {}}}}, '[servers."a"] holds only [servers."a".tools.'),
        ({"servers": {"a": 1}}, '[servers."a"] holds only'),
        (
            {"servers": {"a": {"tools": {"x": {"key_arg": "id"}}}}},
            'unknown policy key(s) in [servers."a".tools."x"]: key_arg',
        ),
        (
            {"servers": {"a": {"tools": {"x": {"guard": "no"}}}}},
            '[servers."a".tools."x"] guard must be true or false',
        ),
    ],
)
def test_a_bad_servers_section_is_an_error_naming_it(data: dict[str, object], said: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(data)
    assert said in str(caught.value)


def test_names_that_would_collide_on_one_front_are_refused() -> None:
    def named(*names: str) -> list[Upstream]:
        return [Upstream.stdio("node", f"{name}.js", name=name) for name in names]

    check_names(named("git", "github", "memory"))  # `git_` starts no other's name
    with pytest.raises(UpstreamConfigError, match="'git' and 'git_work' cannot share a front"):
        check_names(named("memory", "git_work", "git"))
    with pytest.raises(UpstreamConfigError, match="two upstreams are named 'a'"):
        check_names(named("a", "a"))


def test_server_may_be_given_several_times() -> None:
    args = parse_args(["proxy", "--config", "c.json", "--server", "a", "--server", "b"])
    assert args.servers == ["a", "b"] and args.server == "a"
    assert parse_args(["proxy", "--config", "c.json"]).servers == []


def _config(tmp_path: Path, servers: dict[str, object]) -> str:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"mcpServers": servers}))
    return str(config)


@pytest.mark.parametrize(
    ("servers", "options", "said"),
    [
        ({"a": {"command": "node"}}, ["--name", "x"], "--name names one upstream"),
        ({}, [], "no servers in"),
        (
            {"git": {"command": "node"}, "git_work": {"command": "node"}},
            [],
            "'git' and 'git_work' cannot share a front",
        ),
        ({"a": {"command": "node"}}, ["--server", "a", "--server", "b"], "no server 'b'"),
        ({"a": {"command": "node"}}, ["--upstream", "http://x/mcp"], "conflicting upstreams"),
    ],
)
def test_a_front_of_several_is_refused_as_bad_input(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    servers: dict[str, object],
    options: list[str],
    said: str,
) -> None:
    """Exit 2, one line, before anything starts."""
    with pytest.raises(SystemExit) as caught:
        main(["proxy", "--store", "memory://", "--config", _config(tmp_path, servers), *options])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err


def test_a_config_entry_serving_its_own_file_stops_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry of FILE that runs `mcp-once proxy --config FILE` (the whole file on one front,
    itself included) would start one proxy after another: refused before anything starts."""
    monkeypatch.chdir(tmp_path)
    itself = [sys.executable, "-m", "mcp_once", "proxy", "--config", "config.json"]
    servers = {
        "real": {"command": "node", "args": ["s.js"]},
        "all": {"command": itself[0], "args": itself[1:]},
    }
    config = _config(tmp_path, servers)
    with pytest.raises(SystemExit) as caught:
        main(["proxy", "--store", "memory://", "--config", config])
    assert caught.value.code == 2
    assert "proxy loop: 'all' -> 'all'" in capsys.readouterr().err


@dataclasses.dataclass
class _Sent:
    """What `as_sent_upstream` reads and replaces of a request context: its HTTP request."""

    request: Request | None


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (b"a_t-1", "t-1"),  # names the front's id: the upstream's proxy sees its own
        (b"a_t-2", "a_t-2"),  # names another task: left as sent, for the proxy to refuse
        (None, None),  # none sent: none made up
    ],
)
def test_a_routed_task_request_names_the_upstreams_own_id_in_its_header(
    header: bytes | None, expected: str | None
) -> None:
    """The gateway sends a task request on to the upstream's proxy with the upstream's own id
    in its body; its `Mcp-Name` header (the task on the 2026-07-28 HTTP transport) is made to
    agree, when it named the front's id, so the proxy's header check sees one task."""
    headers = [(b"content-type", b"application/json")]
    if header is not None:
        headers.append((b"mcp-name", header))
    ctx = _Sent(Request({"type": "http", "headers": headers}))
    sent = as_sent_upstream(ctx, "a_t-1", "t-1")
    assert sent.request.headers.get("mcp-name") == expected
    assert sent.request.headers["content-type"] == "application/json"
    assert as_sent_upstream(_Sent(None), "a_t-1", "t-1") == _Sent(None)  # not over HTTP


def test_a_non_ascii_task_id_is_encoded_in_the_header() -> None:
    ctx = _Sent(Request({"type": "http", "headers": [(b"mcp-name", b"a_t")]}))
    sent = as_sent_upstream(ctx, "a_t", "tâche")
    assert decode_header_value(sent.request.headers["mcp-name"]) == "tâche"
