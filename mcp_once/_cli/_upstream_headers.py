"""`--upstream-header NAME:ENV_VAR`: a header the proxy sends its HTTP upstream, its value read from
an environment variable.

The upstream gets the proxy's own credentials, never its callers' (no token passthrough): the
`headers` of a `--config` entry, or these. A value is never given on the command line, where
`ps`, shell history and a desktop client's config file would show it: the option names the
variable that holds it. Like a config entry's headers, the value is part of the upstream's
identity (hashed, never stored): a new token is a new upstream.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from mcp_once._upstream import Upstream, UpstreamConfigError

#: An HTTP header name (RFC 9110 token) and an environment variable's name.
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def add_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--upstream-header",
        action="append",
        default=[],
        metavar="NAME:ENV_VAR",
        help="send the HTTP upstream header NAME with the value of the environment variable"
        " ENV_VAR (e.g. Authorization:UPSTREAM_AUTH); repeatable",
    )


def with_headers(
    upstream: Upstream, options: Sequence[str], environ: Mapping[str, str]
) -> Upstream:
    """`upstream` with the headers `options` name, their values from `environ`; or
    `UpstreamConfigError` saying what is wrong (never a value)."""
    if not options:
        return upstream
    if upstream.url is None:
        raise UpstreamConfigError(
            "--upstream-header is for an HTTP upstream (--upstream URL, or a config entry with"
            " a url): a stdio child gets its credentials from its environment"
        )
    headers = dict(upstream.headers)
    taken = {name.lower() for name in headers}
    for option in options:
        name, _, variable = option.partition(":")
        if not _HEADER.fullmatch(name) or not _VARIABLE.fullmatch(variable):
            raise UpstreamConfigError(
                f"--upstream-header takes NAME:ENV_VAR, a header name and the environment"
                f" variable holding its value (never the value itself), not {name!r}:..."
            )
        if name.lower() in taken:
            raise UpstreamConfigError(f"--upstream-header {name}: the upstream has that header")
        value = environ.get(variable)
        if not value:
            raise UpstreamConfigError(
                f"--upstream-header {name}:{variable}: the environment variable {variable} is"
                " not set"
            )
        headers[name] = value
        taken.add(name.lower())
    return replace(upstream, headers=headers)
