"""`mcp-once proxy` (the guard in front of a server you did not write) and `mcp-once tools` (what
the proxy would do with each of its tools, and why).

The upstream is named in one of three ways: a command line (`-- COMMAND ARGS...`, or the command
right after the options: launchers such as the MCP Inspector drop the `--`), `--upstream URL`
(streamable HTTP), or `--config FILE --server NAME` (a desktop client's `mcpServers` entry). Its
name (`--name`, else the entry's, else a word of the command) and identity (`identity.py`) scope
the proxy's records and name its default store, in the user's state folder (`_proxies.py`).

An upstream whose command is itself `mcp-once proxy ...` is seen through (`wrapped`): `tools`
shows the real upstream's tools and says so, and a proxy whose upstream would start this same
proxy again stops at once, exit 2, naming the loop (the child's environment carries the chain of
upstreams too, for a loop no command line shows: a script that runs the proxy).

Both commands import FastMCP only when run, so the rest of the CLI works without the `fastmcp`
extra.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from mcp_once._upstream import LoopError, Upstream, UpstreamConfigError, check_chain, loop_message
from mcp_once._upstream import replay as replaying
from mcp_once._upstream.early import EarlyChild, start_early

from . import _front, _stopping, _upstream_headers
from ._common import (
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    add_store_option,
    fail,
    open_or_fail,
    redacted,
)
from ._proxies import (
    Manifest,
    StateFolderUnwritable,
    default_store,
    print_proxies,
    record,
    state_folder,
)
from ._serve import serve_on

if TYPE_CHECKING:
    from mcp_types import Tool

    from idempotency import KeyStore
    from mcp_once.proxy import OnceGateway, OnceProxy, ProxyPolicy

logger = logging.getLogger("mcp_once.proxy")

#: `proxy --log-level`'s choices.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

#: The commands that take an upstream's command line after their options.
TAKES_COMMAND = frozenset({"proxy", "tools"})


class _ServerNames(argparse.Action):
    """`--server NAME`, repeatable: `servers` lists every name given, `server` is the first."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        namespace.servers = [*(getattr(namespace, "servers", None) or []), str(values)]
        namespace.server = namespace.servers[0]


def _add_upstream_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--upstream", metavar="URL", help="the upstream's streamable HTTP URL")
    parser.add_argument("--config", metavar="FILE", help="a desktop client's mcpServers JSON")
    parser.add_argument(
        "--server",
        metavar="NAME",
        action=_ServerNames,
        help="the server of --config to proxy (proxy: repeat it, or leave it out for every"
        " server, to serve several on one front, their tools named SERVER_TOOL)",
    )
    parser.set_defaults(servers=[])
    parser.add_argument(
        "--policy",
        metavar="FILE",
        help='per-tool policy (TOML, [tools."<name or glob>"] tables, and'
        ' [servers."<name>".tools."<name or glob>"] for one upstream only)',
    )
    _upstream_headers.add_option(parser)


def add_parser(commands: Any) -> None:
    proxy = commands.add_parser(
        "proxy",
        help="serve an MCP server you did not write, its tools guarded (-- COMMAND, --upstream)",
        description="An MCP server that forwards to one upstream and runs its tools under the"
        " idempotency guard. Upstream: [--] COMMAND ARGS... (a stdio child, restarted on the"
        " next call when it dies), --upstream URL, or --config FILE --server NAME; --config FILE"
        " alone (or with several --server) serves every (named) server on one front, each tool"
        " named SERVER_TOOL, each upstream with its own records and policy section. Front: stdio,"
        " or streamable HTTP with --listen (the Idempotency-Key header is read there). Its"
        " records are scoped by the upstream's name and identity (command, arguments, working"
        " directory and the entry's env, or URL and headers): two upstreams never share one.",
    )
    _add_upstream_options(proxy)
    proxy.add_argument(
        "--name",
        metavar="NAME",
        help="the upstream's name, in its records' scope, its store's file name and --list"
        " (default: the --config entry's name, else a word of the command or URL)",
    )
    proxy.add_argument(
        "--listen", metavar="HOST:PORT", help="serve streamable HTTP at http://HOST:PORT/mcp"
    )
    proxy.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="WARNING",
        help="what the proxy logs to stderr (default: %(default)s: one line per outcome an"
        " operator must act on, such as -32012; DEBUG adds the tracebacks behind them)",
    )
    proxy.add_argument(
        "--list",
        action="store_true",
        help="list the proxies started on this machine, their stores and upstreams, and exit",
    )
    add_store_option(
        proxy,
        fallback=f"a SQLite file per upstream in {state_folder()}{os.sep} (NAME-ID.sqlite3)",
    )
    _front.add_options(proxy)
    proxy.set_defaults(run=run_proxy)
    tools = commands.add_parser(
        "tools",
        help="list an upstream's tools, their annotations and what the proxy does with each",
        description="What mcp-once proxy would do with each tool of an upstream, and why; flags"
        " contradicting annotations and tools with none. An upstream that is itself mcp-once"
        " proxy is seen through: its own upstream's tools are shown.",
    )
    _add_upstream_options(tools)
    tools.add_argument("--json", action="store_true", help="one JSON object per tool, in a list")
    tools.set_defaults(run=run_tools)


def split_command(
    parser: argparse.ArgumentParser, words: Sequence[str]
) -> tuple[list[str], list[str]]:
    """`words` (a command's arguments after its name) as its options and the upstream's command
    line: after `--`, or from the first word that is neither an option of `parser` nor an
    option's value, as `env`, `sudo` or `uvx` read their command lines (the MCP Inspector and
    other launchers drop the `--`). Options after the command are the command's."""
    takes_value: dict[str, bool] = {}
    for action in parser._actions:
        for option in action.option_strings:
            takes_value[option] = action.nargs != 0
    index = 0
    while index < len(words):
        word = words[index]
        if word == "--":
            return list(words[:index]), list(words[index + 1 :])
        if word == "-" or not word.startswith("-"):
            return list(words[:index]), list(words[index:])
        name, has_value, _ = word.partition("=")
        # argparse takes a unique prefix of a long option (`--stor`): so does this.
        options = [o for o in takes_value if o == name] or [
            o for o in takes_value if o.startswith(name) and name.startswith("--")
        ]
        value_follows = len(options) == 1 and takes_value[options[0]] and not has_value
        index += 2 if value_follows else 1
    return list(words), []


def parse_proxy_arguments(words: Sequence[str]) -> argparse.Namespace:
    """`mcp-once proxy WORDS...` read as the CLI reads it (SystemExit on a usage error)."""
    root = argparse.ArgumentParser(prog="mcp-once")
    add_parser(root.add_subparsers(dest="command"))
    return parse_command(root, ["proxy", *words])


def parse_command(root: argparse.ArgumentParser, words: Sequence[str]) -> argparse.Namespace:
    """`words` (a `proxy` or `tools` command line) parsed by `root`, the CLI's parser: the
    options by argparse, the upstream's command line (`split_command`) untouched in
    `command_line`."""
    commands = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    options, command_line = split_command(commands.choices[words[0]], words[1:])
    args = root.parse_args([words[0], *options])
    args.command_line = command_line
    return args


def serves_several(args: argparse.Namespace) -> bool:
    """Whether `args` name the servers of a config file to serve on one front: `--config FILE`
    without `--server`, or with several."""
    return args.config is not None and len(args.servers) != 1


def check_upstreams_named(args: argparse.Namespace) -> None:
    """`UpstreamConfigError` unless `args` name their upstream(s) one way: a command,
    `--upstream URL` or `--config FILE`."""
    command: list[str] = args.command_line
    named = [
        f"the command {command[0]!r}" if command else None,
        f"--upstream {args.upstream}" if args.upstream is not None else None,
        f"--config {args.config}" if args.config is not None else None,
    ]
    given = [n for n in named if n is not None]
    if not given:
        raise UpstreamConfigError(
            "name one upstream: [--] COMMAND ARGS..., --upstream URL, or --config FILE"
            " --server NAME"
        )
    if len(given) > 1:
        raise UpstreamConfigError(
            f"conflicting upstreams: {' and '.join(given)} each name one; a proxy serves one"
            " upstream: give only one of them"
        )
    if args.config is None and args.servers:
        raise UpstreamConfigError("--server names an entry of --config FILE: give the file")


def upstream_of(
    args: argparse.Namespace, folder: str | None = None, environ: Mapping[str, str] | None = None
) -> Upstream:
    """The upstream `args` name, or `UpstreamConfigError` saying what is wrong (no upstream, two
    that conflict, a bad config entry or name). `folder`: where a relative `--config` is read
    from (the working directory of the proxy that was given it); `environ`: where its
    `--upstream-header` values are read (that proxy's environment; default ours)."""
    check_upstreams_named(args)
    command: list[str] = args.command_line
    if args.config is not None and len(args.servers) != 1:
        raise UpstreamConfigError(
            "--config FILE names one upstream here with one --server NAME (`mcp-once proxy"
            " --config FILE` serves several on one front)"
        )
    if command:
        upstream = Upstream.stdio(*command)
    elif args.upstream is not None:
        upstream = Upstream.http(args.upstream)
    else:
        upstream = Upstream.from_config(os.path.join(folder or "", args.config), args.server)
    name = getattr(args, "name", None)
    upstream = upstream if name is None else replace(upstream, label=name)
    headers = getattr(args, "upstream_header", None) or []
    return _upstream_headers.with_headers(
        upstream, headers, os.environ if environ is None else environ
    )


def _upstream(args: argparse.Namespace) -> Upstream:
    try:
        return upstream_of(args)
    except UpstreamConfigError as exc:
        fail(str(exc), EXIT_USAGE)


@dataclass(frozen=True, slots=True)
class Wrapped:
    """An upstream that an upstream's `mcp-once proxy` command serves, with that proxy's policy."""

    upstream: Upstream
    policy: str | None


def proxied_arguments(command: Sequence[str]) -> list[str] | None:
    """The arguments after `proxy` when `command` runs `mcp-once proxy` (`mcp-once proxy ...`,
    `/path/to/mcp-once proxy ...`, `python -m mcp_once proxy ...`, `uvx mcp-once proxy ...`),
    else None."""
    for index, word in enumerate(command[:-1]):
        runs = Path(word).name in ("mcp-once", "mcp-once.exe") or (
            word == "mcp_once" and index > 0 and command[index - 1] == "-m"
        )
        if runs and command[index + 1] == "proxy":
            return list(command[index + 2 :])
    return None


def _inner(upstream: Upstream) -> Wrapped | None:
    """What `upstream` serves when its command is `mcp-once proxy ...` (None when it is not, or
    its arguments name no upstream): read with this CLI's own parser, relative paths from the
    folder that proxy would run in, the entry's env and folder passed on as they would be."""
    rest = proxied_arguments(upstream.command)
    if rest is None:
        return None
    folder = os.path.join(os.getcwd(), upstream.cwd or ".")
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = parse_proxy_arguments(rest)
        inner = upstream_of(args, folder, {**os.environ, **upstream.env})
    except (SystemExit, UpstreamConfigError):
        return None
    if inner.command:
        # That proxy's child sees its environment (the entry's env) and runs in its folder.
        cwd = os.path.join(folder, inner.cwd or ".")
        inner = replace(inner, env={**upstream.env, **inner.env}, cwd=os.path.normpath(cwd))
    policy = None if args.policy is None else os.path.join(folder, args.policy)
    return Wrapped(inner, policy)


#: How deep a chain of proxies in front of proxies is followed.
_DEPTH = 16


def seen_through(upstream: Upstream) -> tuple[list[Wrapped], bool]:
    """The upstreams behind `upstream`'s own `mcp-once proxy` commands, outermost first, and
    whether the chain comes back to an upstream it has passed (a loop)."""
    found: list[Wrapped] = []
    launches = [upstream.identity.launch]
    current = upstream
    while len(found) < _DEPTH and (inner := _inner(current)) is not None:
        found.append(inner)
        if inner.upstream.identity.launch in launches:
            return found, True
        launches.append(inner.upstream.identity.launch)
        current = inner.upstream
    return found, False


def warn_wrapped(upstream: Upstream, wrapped: list[Wrapped]) -> None:
    """Say that `upstream` is itself a proxy (`wrapped`: what it serves), if it is."""
    if wrapped:
        logger.warning(
            "the upstream %r is itself mcp-once proxy, in front of %s: every call is guarded"
            " twice, on two stores; proxy that upstream directly",
            upstream.name,
            wrapped[-1].upstream.name,
        )


def check_loops(upstream: Upstream) -> list[Wrapped]:
    """Exit 2 naming the loop when `upstream` would start this proxy again, seen in its command
    line or in the chain this proxy was started in; else the proxies it is wrapped in."""
    wrapped, loop = seen_through(upstream)
    if loop:
        fail(loop_message([upstream.name, *(w.upstream.name for w in wrapped)]), EXIT_USAGE)
    try:
        check_chain(upstream.identity)
    except LoopError as exc:
        fail(str(exc), EXIT_USAGE)
    return wrapped


def _policy(args: argparse.Namespace) -> ProxyPolicy:
    from mcp_once.proxy import PolicyError, ProxyPolicy, load_policy

    if args.policy is None:
        return ProxyPolicy()
    try:
        return load_policy(args.policy)
    except PolicyError as exc:
        fail(str(exc), EXIT_USAGE)


def _need_fastmcp() -> None:
    try:
        import mcp_once.proxy  # noqa: F401
    except ImportError as exc:
        fail(str(exc), EXIT_USAGE)


def _listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        fail(f"--listen takes HOST:PORT, not {value!r}", EXIT_USAGE)
    return host.strip("[]"), int(port)


def _store_url(args: argparse.Namespace, stem: str) -> str:
    """`--store`, else `$MCP_ONCE_STORE`, else the upstream's own SQLite file in the state folder
    (`_proxies.py`), so that a restarted proxy keeps its records, wherever it is started from."""
    return str(args.store) if args.store is not None else default_store(stem)


def _record(upstream: Upstream, url: str, *, default: bool) -> Manifest | None:
    """Write the proxy's manifest (and return it; None when it cannot be written). Where the
    store is the default one (in the same folder), a folder that cannot be written stops the
    proxy (exit 2, one line); with a store of its own it only cannot be found by name, which a
    warning says."""
    identity = upstream.identity
    manifest = Manifest(
        name=identity.name,
        id=identity.id,
        server=identity.server,
        store=redacted(url),
        upstream=upstream.described(),
        started_at=round(time.time(), 3),
    )
    try:
        record(manifest, identity.stem)
        return manifest
    except StateFolderUnwritable as exc:
        if default:
            fail(
                f"cannot write the state folder {state_folder()} for the proxy's key store"
                f" ({exc}): make it writable, or give the store with --store URL (or"
                " $MCP_ONCE_STORE)",
                EXIT_USAGE,
            )
        logger.warning(
            "cannot record this proxy in the state folder (%s): `mcp-once proxy --list` and"
            " `--proxy %s` will not find it",
            exc,
            identity.name,
        )
        return None


def _listed(manifest: Manifest | None, stem: str) -> Callable[[dict[str, Any]], None] | None:
    """`build_proxy`'s `on_listing`: the manifest written again with the tools' output schemas,
    for `keys settle --proxy NAME` (a folder that went read-only since: left as it was)."""
    if manifest is None:
        return None

    def listed(schemas: dict[str, Any]) -> None:
        with contextlib.suppress(StateFolderUnwritable):
            record(replace(manifest, output_schemas=schemas), stem)

    return listed


def run_proxy(args: argparse.Namespace) -> int:
    if args.list:
        return print_proxies()
    level = start_logging(args)
    listen = _listen(args.listen) if args.listen else None
    front = _front.check(args, listen)  # at once: an open listener is refused before anything
    upstream = _upstream(args)
    wrapped = check_loops(upstream)  # at once: before the child starts, or FastMCP is imported

    def build(early: EarlyChild | None) -> Built:
        _need_fastmcp()
        quiet_below(level)
        from mcp_once.proxy import PolicyError, build_proxy

        auth = _front.auth_of(front)
        warn_wrapped(upstream, wrapped)
        policy = _policy(args)
        identity = upstream.identity
        url = _store_url(args, identity.stem)
        manifest = _record(upstream, url, default=args.store is None)
        store = open_or_fail(url)
        options: dict[str, Any] = {"key_header": "Idempotency-Key"} if listen else {}
        options["on_listing"] = _listed(manifest, identity.stem)
        limits: dict[str, Any] = {"max_in_flight": args.max_in_flight, "max_body": args.max_body}
        try:
            server = build_proxy(upstream, store, policy=policy, auth=auth, **limits, **options)
        except (PolicyError, TypeError, ValueError) as exc:
            fail(f"the policy cannot be applied: {exc}", EXIT_USAGE)
        server.link.adopt(early)
        return Built(server, [store], redacted(url), auth)

    return serve(build, listen, front, upstream, _replay(args, upstream, listen))


def _replay(
    args: argparse.Namespace, upstream: Upstream, listen: tuple[str, int] | None
) -> replaying.Start | None:
    """This start's replay of the proxy's previous first answers (`replay.py`), where one
    serves: a stdio front on pipes, one stdio upstream, replaying not turned off."""
    if listen is not None or not upstream.command or not replaying.enabled():
        return None
    if not replaying.eligible():
        return None
    files = [f for f in (args.policy, args.config, args.auth_tokens) if f is not None]
    static = replaying.static_inputs(files)  # the costly part later, where it is needed
    if static is None:
        return None
    return replaying.Start(state_folder() / f"{upstream.identity.stem}{replaying.SUFFIX}", static)


@dataclass(frozen=True, slots=True)
class Built:
    """What `serve` serves: the server, the stores to close after, the store as shown, and
    FastMCP's provider of the front's authentication (None: none)."""

    server: OnceProxy | OnceGateway
    stores: Sequence[KeyStore]
    shown: str
    auth: Any


def serve(
    build: Callable[[EarlyChild | None], Built],
    listen: tuple[str, int] | None,
    front: _front.Front,
    upstream: Upstream | None = None,
    replay: replaying.Start | None = None,
) -> int:
    """Serve what `build` makes on stdio, or streamable HTTP at `listen` behind `front`, until
    interrupted; then close its stores. A stdio upstream that cannot be started stops it: exit
    2, one line.

    `upstream` (a stdio one: else nothing happens early) has its child started first, and
    `build` (which imports FastMCP: about a second) runs while that child starts; `build` gives
    the child to its proxy's link, which adopts it for its first session
    (`mcp_once._upstream.early`). A child nothing adopted (`build` stopped on bad input) is
    stopped before the exit. With `replay`, the caller's first answers may be given from the
    proxy's previous start before `build` runs (`mcp_once._upstream.replay`). A stdio front
    stops on stdin EOF, SIGTERM or SIGINT, its children stopped and stores closed, and the
    process then exits without the interpreter's teardown (`_stopping`)."""

    opened: list[KeyStore] = []

    async def close_stores() -> None:
        """Close the stores `build` opened, each once (also `_stopping`'s, on a run that a
        signal did not end)."""
        while opened:
            await opened.pop().aclose()

    async def run() -> None:
        early = None if upstream is None else await start_early(upstream)
        replaying.current = None  # this run's, if any (not an earlier run's in this process)
        try:
            if early is not None and early.waiting is not None and replay is not None:
                early.replay = replaying.current = replay
                if not await replay.answer(early.waiting):
                    await early.aclose()  # it failed: the link starts one the usual way
            built = build(early)
            opened.extend(built.stores)
            await _serving(built, listen, front)
        finally:
            with anyio.CancelScope(shield=True):
                if early is not None:
                    await early.aclose()
                await close_stores()

    if listen is None:  # stdio: stopped on EOF, SIGTERM or SIGINT, then exits at once
        anyio.run(_stopping.until_stopped, run, close_stores)
        _stopping.served = True
        return EXIT_OK
    # uvicorn re-raises the Ctrl-C it handled, after a clean shutdown.
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(run)
    return EXIT_OK


async def _serving(built: Built, listen: tuple[str, int] | None, front: _front.Front) -> None:
    from mcp_once.proxy import UpstreamStartFailed

    server = built.server
    try:
        if listen is None:
            await server.run_async(transport="stdio", show_banner=False)
            return
        host, port = listen
        await _front.announce(front, built.auth)
        async with server.opened():
            # Host and Origin are checked when the proxy listens on a loopback address (DNS
            # rebinding: a web page must not reach a local proxy), as MCP's transports say;
            # FastMCP's default checks nothing.
            app = server.http_app(host_origin_protection="auto")
            await serve_on(app, host, port, "mcp-once proxy", built.shown)
    except UpstreamStartFailed as exc:
        fail(str(exc), EXIT_USAGE)


def start_logging(args: argparse.Namespace) -> int:
    """Log to stderr (stdout is the MCP channel in stdio) at `--log-level`; that level."""
    level = logging.getLevelNamesMapping()[args.log_level]
    logging.basicConfig(level=level)
    return level


def quiet_below(level: int) -> None:
    """One line per outcome (the guard's, the proxy's): FastMCP's own logger (its own handler,
    INFO by default: a start line in a box on every start) at the proxy's level, and the
    upstream link's client library, whose warnings say again what the proxy's line says, only
    from INFO down."""
    logging.getLogger("fastmcp").setLevel(level)
    logging.getLogger("orchestrator").setLevel(level if level < logging.WARNING else logging.ERROR)


def run_tools(args: argparse.Namespace) -> int:
    upstream = _upstream(args)
    wrapped = check_loops(upstream)
    _need_fastmcp()
    from mcp_once.proxy.failures import UpstreamUnreachable
    from mcp_once.proxy.report import rows, table

    if wrapped:
        real = wrapped[-1]
        said = f"mcp-once: {upstream.name!r} is already wrapped: it runs mcp-once proxy in front of"
        said += f" {real.upstream.described()}; showing that upstream's tools"
        if args.policy is None and real.policy is not None:
            args.policy = real.policy
            said += f", with that proxy's policy {real.policy}"
        print(said, file=sys.stderr)
        upstream = real.upstream
    policy = _policy(args)

    try:
        tools = anyio.run(upstream_tools, upstream)
    except UpstreamUnreachable as exc:
        fail(f"cannot reach the upstream {upstream.name}: {exc.__cause__ or exc}", EXIT_UNREACHABLE)
    found = rows(tools, policy.for_server(upstream.name))
    if args.json:
        print(json.dumps([r.as_json() for r in found], indent=2))
    else:
        print(table(found))
    for sentence in policy.for_server(upstream.name).unmatched_said(t.name for t in tools):
        print(f"mcp-once: {sentence}", file=sys.stderr)
    return EXIT_OK


async def upstream_tools(upstream: Upstream) -> list[Tool]:
    """`upstream`'s tools, listed through the proxy's own link (as `tools` and `wrap` show them);
    its child, if any, stopped after. Needs FastMCP."""
    from mcp_once.proxy import UpstreamLink

    async with UpstreamLink(upstream) as link:
        client = await link.client()
        return list(await client.list_tools())
