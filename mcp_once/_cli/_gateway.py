"""`mcp-once proxy --config FILE` without `--server` (or with several): every (named) server of a
desktop client's config on one front, each tool named `SERVER_TOOL` (`mcp_once.proxy.gateway`).

Each upstream is what `--config FILE --server NAME` would proxy, checked the same way (a loop
stops the proxy, exit 2; an entry that is itself a proxy is warned about), with its own records:
by default each in its own store file in the state folder, the one a single proxy of that entry
uses (`NAME-ID.sqlite3`), with its own manifest, so `keys ... --proxy NAME` finds each upstream's
records whether it was served alone or beside others; with `--store URL`, one store for all,
records scoped by each upstream's identity.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from mcp_once._upstream import Upstream, UpstreamConfigError, check_names, loop_message

from . import _front, _proxy
from ._common import EXIT_USAGE, fail, open_or_fail, redacted
from ._proxies import state_folder
from ._proxy import (
    Built,
    _listed,
    _listen,
    _need_fastmcp,
    _policy,
    _record,
    _store_url,
    check_loops,
    check_upstreams_named,
    parse_proxy_arguments,
    proxied_arguments,
    quiet_below,
    run_proxy,
    serve,
    serves_several,
    start_logging,
    warn_wrapped,
)

if TYPE_CHECKING:
    from idempotency import KeyStore


def add_parser(commands: Any) -> None:
    """`proxy` and `tools` (`_proxy.py`); `proxy` runs here, and serves several upstreams on one
    front where its arguments name them."""
    _proxy.add_parser(commands)
    commands.choices["proxy"].set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.list or not serves_several(args):
        return run_proxy(args)
    return run_gateway(args)


def upstreams_of(args: argparse.Namespace, folder: str | None = None) -> list[Upstream]:
    """The upstreams of `--config FILE` (those named by `--server`, in that order, else every
    entry in the file's order), or `UpstreamConfigError` saying what is wrong. `folder`: where a
    relative `--config` is read from."""
    check_upstreams_named(args)
    if getattr(args, "name", None) is not None:
        raise UpstreamConfigError(
            "--name names one upstream; in front of several, each is named by its --config entry"
        )
    path = os.path.join(folder or "", args.config)
    names = list(dict.fromkeys(args.servers)) or Upstream.config_names(path)
    if not names:
        raise UpstreamConfigError(f"no servers in {args.config} (an mcpServers object)")
    upstreams = [Upstream.from_config(path, name) for name in names]
    check_names(upstreams)
    return upstreams


def _serves_itself(upstream: Upstream) -> bool:
    """Whether `upstream`'s command runs `mcp-once proxy --config ...` in front of several
    servers, one of them `upstream` itself (the same launch): a proxy that would start itself."""
    rest = proxied_arguments(upstream.command)
    if rest is None:
        return False
    folder = os.path.join(os.getcwd(), upstream.cwd or ".")
    try:
        inner_args = parse_proxy_arguments(rest)
        if not serves_several(inner_args):
            return False
        inner = upstreams_of(inner_args, folder)
    except (SystemExit, UpstreamConfigError):
        return False
    # Each runs in the folder that proxy would give it, as `_proxy._inner` reads one.
    launches = {
        replace(u, cwd=os.path.normpath(os.path.join(folder, u.cwd or "."))).identity.launch
        for u in inner
        if u.command
    }
    return upstream.identity.launch in launches


def run_gateway(args: argparse.Namespace) -> int:
    level = start_logging(args)
    listen = _listen(args.listen) if args.listen else None
    front = _front.check(args, listen)  # at once: an open listener is refused before anything
    try:
        upstreams = upstreams_of(args)
    except UpstreamConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    wrapped: dict[str, Any] = {}
    for upstream in upstreams:  # at once: before FastMCP is imported (seconds)
        if _serves_itself(upstream):
            fail(loop_message([upstream.name, upstream.name]), EXIT_USAGE)
        wrapped[upstream.name] = check_loops(upstream)
    _need_fastmcp()
    quiet_below(level)
    from mcp_once.proxy import PolicyError, build_gateway

    for upstream in upstreams:
        warn_wrapped(upstream, wrapped[upstream.name])
    auth = _front.auth_of(front)
    policy = _policy(args)
    urls = {u.name: _store_url(args, u.identity.stem) for u in upstreams}
    listed: dict[str, Any] = {}
    for upstream in upstreams:
        manifest = _record(upstream, urls[upstream.name], default=args.store is None)
        on_listing = _listed(manifest, upstream.identity.stem)
        if on_listing is not None:
            listed[upstream.name] = on_listing
    opened: dict[str, KeyStore] = {}
    for url in urls.values():
        if url not in opened:
            opened[url] = open_or_fail(url)
    stores = {name: opened[url] for name, url in urls.items()}
    options: dict[str, Any] = {"key_header": "Idempotency-Key"} if listen else {}
    try:
        server = build_gateway(
            upstreams,
            stores,
            policy=policy,
            auth=auth,
            max_in_flight=args.max_in_flight,
            max_body=args.max_body,
            on_listing=listed,
            **options,
        )
    except (PolicyError, TypeError, ValueError) as exc:
        fail(f"the policy cannot be applied: {exc}", EXIT_USAGE)
    shown = (
        redacted(next(iter(opened)))
        if len(opened) == 1
        else f"a SQLite file per upstream in {state_folder()}"
    )
    return serve(lambda _: Built(server, list(opened.values()), shown, auth), listen, front)
