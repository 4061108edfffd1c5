"""Every command's help, walked: no secret from the environment, a description everywhere, and
no URL broken across lines (issue 38). Each page is what `mcp-once ... --help` prints, with a
password in every environment variable the CLI reads."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterator

import pytest
from cli_run import sync_cli

from mcp_once._cli import build_parser

PASSWORD = "hunter2"
#: Every environment variable the CLI reads (a test below checks the list is complete).
VARIABLES = {
    "MCP_ONCE_STORE": f"redis://operator:{PASSWORD}@127.0.0.1:6379/0",
    "MCP_ONCE_JOURNAL": f"rediss://:{PASSWORD}@127.0.0.1:6380/1",
    "MCP_ONCE_AUDIT_KEY": f"audit-key-{PASSWORD}",
    "MCP_ONCE_AUDIT_KEY_FILE": "/nonexistent/mcp-once-audit-key",
}


def pages(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from pages(sub, (*path, name))


def test_the_variables_listed_are_all_the_cli_reads() -> None:
    package = os.path.dirname(sys.modules["mcp_once._cli"].__file__ or "")
    read: set[str] = set()
    for name in os.listdir(package):
        if name.endswith(".py"):
            with open(os.path.join(package, name)) as source:
                read |= set(re.findall(r"\b(MCP_ONCE_[A-Z_]+)\b", source.read()))
    assert read == set(VARIABLES)


@pytest.mark.parametrize("path", [path for path, _ in pages(build_parser())], ids=" ".join)
def test_help_shows_no_secret_a_description_and_whole_urls(
    path: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in {**VARIABLES, "COLUMNS": "80"}.items():
        monkeypatch.setenv(name, value)
    ran = sync_cli(capsys, *path, "--help")
    assert ran.code == 0, ran.err
    assert PASSWORD not in ran.out + ran.err
    parser = dict(pages(build_parser()))[path]
    if path != ("bench",):  # bench's own options are benchmarks/run.py's
        assert parser.description, f"mcp-once {' '.join(path)} has no description"
    texts = [parser.description or "", parser.epilog or ""]
    texts += [a.help for a in parser._actions if a.help and a.help != argparse.SUPPRESS]
    urls = {u for t in texts for u in re.findall(r"\S+://\S*", t) if "%(" not in u}
    for url in urls:
        assert url.rstrip(".,);") in ran.out, f"{url} is broken across lines"


def test_bench_help_works_where_the_benchmarks_are_not(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mcp_once._cli import _bench

    monkeypatch.setattr(_bench, "_checkout_root", lambda: None)  # as installed from a wheel
    helped = sync_cli(capsys, "bench", "--help")
    assert helped.code == 0 and "installed package: clone it" in helped.out.replace("\n", " ")
    refused = sync_cli(capsys, "bench", "--quick")
    assert refused.code == 2 and "run this command from a checkout" in refused.err
