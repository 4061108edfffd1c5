"""An upstream's name and identity, and what the CLI does with them, without starting a process
(fast tier; the real servers behind the proxy are in `test_proxy_desktop.py`).

Rule 22: two upstreams that differ in their name, command, arguments, working directory or
configured env (or URL and headers) are two servers, whatever store they share; one upstream
started again from the same entry and folder is the same one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mcp_once._cli import main, parse_args
from mcp_once._cli._proxies import Manifest, record
from mcp_once._cli._proxy import seen_through
from mcp_once._upstream.identity import (
    CHAIN_VARIABLE,
    SERVER_PREFIX,
    LoopError,
    chain_marking,
    check_chain,
)
from mcp_once.proxy import Upstream, UpstreamConfigError

SECRET = "s3cret-value-never-shown"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state folder of the test's own (`$XDG_STATE_HOME/mcp-once`), no `$MCP_ONCE_STORE`."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("MCP_ONCE_STORE", raising=False)
    monkeypatch.delenv(CHAIN_VARIABLE, raising=False)
    return tmp_path / "state" / "mcp-once"


def test_every_part_of_how_an_upstream_starts_is_part_of_its_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    base = Upstream(
        command=("node", "server.js", "--port", "0"), env={"KEY": "a"}, cwd="/srv", label="x"
    )
    variants = [
        Upstream(command=("nodejs", "server.js", "--port", "0"), env={"KEY": "a"}, cwd="/srv"),
        Upstream(command=("node", "other.js", "--port", "0"), env={"KEY": "a"}, cwd="/srv"),
        Upstream(command=("node", "server.js", "--port", "1"), env={"KEY": "a"}, cwd="/srv"),
        Upstream(command=("node", "server.js", "--port", "0"), env={"KEY": "b"}, cwd="/srv"),
        Upstream(
            command=("node", "server.js", "--port", "0"), env={"KEY": "a", "B": ""}, cwd="/srv"
        ),
        Upstream(command=("node", "server.js", "--port", "0"), env={"KEY": "a"}, cwd="/opt"),
        Upstream(command=("node", "server.js", "--port", "0"), env={"KEY": "a"}),
    ]
    named = [base, *(Upstream(**{**_fields(v), "label": "x"}) for v in variants)]
    ids = {u.identity.id for u in named}
    assert len(ids) == len(named), "each difference is another upstream"
    # Another name for the same launch: another upstream too, on the same launch digest.
    renamed = Upstream(**{**_fields(base), "label": "y"})
    assert renamed.identity.id != base.identity.id
    assert renamed.identity.launch == base.identity.launch
    # The same entry again: the same identity (replicas share records).
    again = Upstream(command=base.command, env=dict(base.env), cwd="/srv", label="x")
    assert again.identity == base.identity
    # HTTP: the URL and each header's value.
    http = Upstream.http("https://a.test/mcp", {"Authorization": "Bearer 1"})
    others = [
        Upstream.http("https://b.test/mcp", {"Authorization": "Bearer 1"}),
        Upstream.http("https://a.test/mcp", {"Authorization": "Bearer 2"}),
        Upstream.http("https://a.test/mcp"),
    ]
    assert http.identity.launch not in {o.identity.launch for o in others}
    # The scope's server name keeps the name readable.
    assert base.identity.server == f"{SERVER_PREFIX}x@{base.identity.id}"


def _fields(upstream: Upstream) -> dict[str, object]:
    names = ("command", "url", "env", "cwd", "headers", "label")
    return {name: getattr(upstream, name) for name in names}


def test_the_working_directory_is_resolved_so_one_entry_is_one_upstream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative `cwd` is the folder it names from where the proxy runs; without one, the
    proxy's own folder: the same entry from the same folder (a desktop client's `/`) is one
    upstream; from another folder (relative arguments may mean other files) another."""
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    relative = Upstream(command=("python", "server.py"), cwd="sub")
    absolute = Upstream(command=("python", "server.py"), cwd=str(tmp_path / "sub"))
    assert relative.identity == absolute.identity
    here = Upstream(command=("python", "server.py")).identity
    monkeypatch.chdir("/")
    assert Upstream(command=("python", "server.py")).identity != here
    assert (
        Upstream(command=("python", "server.py")).identity
        == Upstream.stdio("python", "server.py").identity
    )


def test_a_config_entry_is_named_by_its_key_and_env_values_are_never_shown(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.json"
    entry = {"command": "npx", "args": ["-y", "pkg"], "env": {"API_KEY": SECRET}}
    config.write_text(json.dumps({"mcpServers": {"work": entry, "home": entry}}))
    work, home = (Upstream.from_config(config, name) for name in ("work", "home"))
    assert (work.name, home.name) == ("work", "home")
    assert work.identity.id != home.identity.id
    identity = work.identity
    shown = [identity.id, identity.launch, identity.server, identity.stem, work.described()]
    assert all(SECRET not in text for text in shown)
    assert work.described() == "npx -y pkg (env: API_KEY)"
    remote = Upstream.http("https://user:pw@h.test/mcp?token=t", {"Authorization": SECRET})
    assert remote.described() == "https://h.test/mcp?... (headers: Authorization)"
    assert remote.name == "h.test-mcp"  # neither the URL's password nor its query


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("", "must not be empty"),
        ("x" * 81, "at most 80"),
        ("a\nb", "printable"),
    ],
)
def test_a_bad_name_is_refused(name: str, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UpstreamConfigError, match=said):
        Upstream.stdio("node", "s.js", name=name)
    with pytest.raises(SystemExit) as caught:
        main(["proxy", "--name", name, "--", "node", "s.js"])
    assert caught.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "options", "command"),
    [
        (["proxy", "npx", "-y", "pkg"], {}, ["npx", "-y", "pkg"]),
        (
            ["proxy", "--store", "memory://", "--", "npx", "-y"],
            {"store": "memory://"},
            ["npx", "-y"],
        ),
        (["proxy", "--store", "memory://", "npx", "-y"], {"store": "memory://"}, ["npx", "-y"]),
        (
            ["proxy", "--store=memory://", "node", "--store", "x"],
            {"store": "memory://"},
            ["node", "--store", "x"],
        ),
        (["proxy", "--stor", "memory://", "node"], {"store": "memory://"}, ["node"]),
        (
            ["proxy", "--name", "m", "node", "s.js", "--", "a"],
            {"name": "m"},
            ["node", "s.js", "--", "a"],
        ),
        (["tools", "--json", "uvx", "mcp-server-git"], {"json": True}, ["uvx", "mcp-server-git"]),
        (["proxy", "--list"], {"list": True}, []),
    ],
)
def test_the_command_may_follow_the_options_without_dashes(
    argv: list[str], options: dict[str, object], command: list[str]
) -> None:
    """As the MCP Inspector's CLI passes it (it drops `--`): the first word that is no option of
    ours, nor an option's value, starts the upstream's command; what follows is the command's."""
    args = parse_args(argv)
    assert args.command_line == command
    for name, value in options.items():
        assert getattr(args, name) == value


def test_the_chain_in_the_environment_stops_a_loop() -> None:
    upstream = Upstream.stdio("sh", "start-the-proxy.sh", name="looped")
    identity = upstream.identity
    check_chain(identity, {})  # started by nobody: fine
    marked = {CHAIN_VARIABLE: chain_marking(identity, {})}
    other = Upstream.stdio("node", "real.js").identity
    check_chain(other, marked)  # a proxy for another upstream below it: fine
    with pytest.raises(LoopError, match="proxy loop: 'looped' -> 'looped'"):
        check_chain(identity, marked)
    deeper = {CHAIN_VARIABLE: chain_marking(other, marked)}
    with pytest.raises(LoopError, match=r"'looped' -> 'real\.js' -> 'looped'"):
        check_chain(identity, deeper)
    check_chain(identity, {CHAIN_VARIABLE: "not json"})  # a stray value is no chain


def test_an_entry_running_the_proxy_is_seen_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "config.json"
    proxy = ["-m", "mcp_once", "proxy"]
    servers = {
        "memory": {"command": "node", "args": ["memory.js"], "env": {"MEMORY_FILE_PATH": "m"}},
        "wrapped": {
            "command": "mcp-once",
            "args": ["proxy", "--config", "config.json", "--server", "memory"],
        },
        "twice": {
            "command": "uvx",
            "args": ["mcp-once", "proxy", "--", "/bin/mcp-once", "proxy", "node", "x.js"],
            "env": {"A": "1"},
        },
        "self": {
            "command": "python3",
            "args": [*proxy, "--config", str(config), "--server", "self"],
        },
        "ping": {
            "command": "python3",
            "args": [*proxy, "--config", str(config), "--server", "pong"],
        },
        "pong": {
            "command": "mcp-once",
            "args": ["proxy", "--config", str(config), "--server", "ping"],
        },
    }
    config.write_text(json.dumps({"mcpServers": servers}))
    wrapped, loop = seen_through(Upstream.from_config(config, "wrapped"))
    assert not loop and [w.upstream.identity for w in wrapped] == [
        Upstream.from_config(config, "memory").identity
    ]
    wrapped, loop = seen_through(Upstream.from_config(config, "twice"))
    assert not loop and len(wrapped) == 2
    assert wrapped[-1].upstream.command == ("node", "x.js")
    assert wrapped[-1].upstream.env == {"A": "1"}  # the entry's env reaches the real server
    for looped in ("self", "ping"):
        assert seen_through(Upstream.from_config(config, looped))[1], looped
    assert seen_through(Upstream.stdio("node", "x.js")) == ([], False)


def test_a_state_folder_that_cannot_be_written_is_one_line_naming_it_and_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """HOME a file (as root, permissions cannot make a folder unwritable): the proxy stops before
    it starts anything, and creates nothing in its working directory."""
    home = tmp_path / "home"
    home.write_text("not a folder")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.delenv("MCP_ONCE_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as caught:
        main(["proxy", "--", "no-such-command-started", "x"])
    assert caught.value.code == 2
    said = capsys.readouterr().err
    folder = home / ".local" / "state" / "mcp-once"
    assert said.count("\n") == 1 and said.startswith("mcp-once: cannot write the state folder")
    assert str(folder) in said and "--store" in said
    assert sorted(os.listdir(tmp_path)) == ["home"]


def _manifest(name: str, ident: str, store: str) -> Manifest:
    return Manifest(
        name=name,
        id=ident,
        server=f"{SERVER_PREFIX}{name}@{ident}",
        store=store,
        upstream="node memory.js (env: MEMORY_FILE_PATH)",
        started_at=1.0,
    )


def test_proxy_names_resolve_to_their_store_and_server(
    state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record(_manifest("memory", "aaaaaaaaaaaa", f"sqlite:///{tmp_path}/a.sqlite3"), "memory-a")
    record(_manifest("git", "bbbbbbbbbbbb", "redis://:***@h:6379/0"), "git-b")
    record(_manifest("git", "cccccccccccc", f"sqlite:///{tmp_path}/c.sqlite3"), "git-c")
    assert main(["proxy", "--list"]) == 0
    listed = capsys.readouterr().out
    for shown in ("memory@aaaaaaaaaaaa", "git@bbbbbbbbbbbb", f"{tmp_path}/a.sqlite3"):
        assert shown in listed
    cases = [
        (["keys", "list", "--proxy", "nope"], "no proxy of that name has started on this machine"),
        (["keys", "list", "--proxy", "git"], "2 upstreams have that name"),
        (["keys", "list", "--proxy", "git@bbbbbbbbbbbb"], "give --store with it"),
        (
            [
                "keys",
                "show",
                "--proxy",
                "memory",
                "--server",
                "other",
                "--client-key",
                "k",
                "--tool",
                "t",
            ],
            "name two servers",
        ),
        # Resolved: the store is memory's file (which does not exist: looking creates nothing).
        (
            ["keys", "show", "--proxy", "memory", "--client-key", "k", "--tool", "t"],
            f"{tmp_path}/a.sqlite3",
        ),
        (["audit", "--proxy", "git@cccccccccccc"], f"{tmp_path}/c.sqlite3"),
    ]
    for argv, said in cases:
        with pytest.raises(SystemExit) as caught:
            main(argv)
        assert caught.value.code in (2, 3), argv
        assert said in capsys.readouterr().err, argv
