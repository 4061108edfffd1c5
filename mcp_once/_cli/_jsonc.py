"""JSON (and JSONC: comments, trailing commas) read as a tree of spans of the original text.

`mcp-once wrap` edits a client's config file in place and must keep every byte it does not mean
to change: other settings, key order, indentation, comments, line endings. `json.loads` keeps
none of that, so this parser keeps, for every value, where it starts and ends in the text (and,
for an object's member, where its key is), and the editor (`_wrap_edit.py`) replaces those spans and
nothing else. Decoding is the standard library's (`json.loads` on each string and number token),
so a value read here is the value `json.loads` reads.

Comments (`//` and `/* */`) and trailing commas are read wherever JSONC allows them, and noted
(`Document.jsonc`): whether a file may have them is the client's choice (VS Code's `mcp.json` may,
a Claude Desktop config may not), which the caller decides.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"')
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_WORDS = {"true": True, "false": False, "null": None}
_SPACE = " \t\r\n"
#: A byte order mark is read as space at the very start (some editors write one).
_BOM = "\ufeff"


class JsoncError(ValueError):
    """The text is not JSON (nor JSONC): the message says where (line and column) and why."""


@dataclass(eq=False, slots=True)
class Node:
    """A value: its kind (`object`, `array`, `string`, `number`, `literal`), its span
    `text[start:end]`, its members (an object's) or items (an array's)."""

    kind: str
    start: int
    end: int
    members: list[Member] = field(default_factory=list)
    items: list[Node] = field(default_factory=list)
    #: A string's, number's or literal's decoded value.
    scalar: Any = None

    def member(self, key: str) -> Member | None:
        """An object's member named `key` (the last one, as JSON.parse keeps the last)."""
        found = [m for m in self.members if m.key == key]
        return found[-1] if found else None

    def get(self, key: str) -> Node | None:
        member = self.member(key)
        return None if member is None else member.value

    def value(self) -> Any:
        """The Python value, as `json.loads` gives it (later duplicate keys win)."""
        if self.kind == "object":
            return {m.key: m.value.value() for m in self.members}
        if self.kind == "array":
            return [item.value() for item in self.items]
        return self.scalar


@dataclass(eq=False, slots=True)
class Member:
    """An object's member: its key (decoded) and the key token's span, then its value."""

    key: str
    key_start: int
    key_end: int
    value: Node


@dataclass(frozen=True, slots=True)
class Document:
    text: str
    root: Node
    #: Where the first comment or trailing comma is (line, column), or None: plain JSON.
    jsonc: tuple[int, int] | None


def position(text: str, offset: int) -> tuple[int, int]:
    """(line, column) of `offset`, both from 1."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 1 if text.startswith(_BOM) else 0
        self.jsonc: int | None = None

    def fail(self, why: str, at: int | None = None) -> JsoncError:
        line, column = position(self.text, self.at if at is None else at)
        return JsoncError(f"line {line} column {column}: {why}")

    def _noted(self, at: int) -> None:
        if self.jsonc is None:
            self.jsonc = at

    def space(self) -> None:
        """Skip blanks and comments."""
        text = self.text
        while self.at < len(text):
            char = text[self.at]
            if char in _SPACE:
                self.at += 1
            elif text.startswith("//", self.at):
                self._noted(self.at)
                end = text.find("\n", self.at)
                self.at = len(text) if end < 0 else end
            elif text.startswith("/*", self.at):
                self._noted(self.at)
                end = text.find("*/", self.at + 2)
                if end < 0:
                    raise self.fail("a /* comment is never closed")
                self.at = end + 2
            else:
                return

    def value(self) -> Node:
        self.space()
        if self.at >= len(self.text):
            raise self.fail("a value was expected, the text ended")
        char = self.text[self.at]
        if char == "{":
            return self.container("object", "}")
        if char == "[":
            return self.container("array", "]")
        if char == '"':
            return self.string()
        match = _NUMBER.match(self.text, self.at)
        if match:
            return self.token("number", match.end())
        for word in _WORDS:
            if self.text.startswith(word, self.at):
                return self.token("literal", self.at + len(word))
        raise self.fail(f"a value was expected, not {self.text[self.at : self.at + 12]!r}")

    def token(self, kind: str, end: int) -> Node:
        start, self.at = self.at, end
        return Node(kind, start, end, scalar=json.loads(self.text[start:end]))

    def string(self) -> Node:
        match = _STRING.match(self.text, self.at)
        if match is None:
            raise self.fail("a string is not closed, or holds a bad escape or a control character")
        return self.token("string", match.end())

    def container(self, kind: str, close: str) -> Node:
        node = Node(kind, self.at, self.at)
        self.at += 1
        first = True
        while True:
            self.space()
            if self.text.startswith(close, self.at):
                self.at += 1
                node.end = self.at
                return node
            if not first:
                if not self.text.startswith(",", self.at):
                    raise self.fail(f"',' or '{close}' was expected")
                comma = self.at
                self.at += 1
                self.space()
                if self.text.startswith(close, self.at):
                    self._noted(comma)  # a trailing comma
                    continue
            first = False
            if kind == "object":
                node.members.append(self.member())
            else:
                node.items.append(self.value())

    def member(self) -> Member:
        if not self.text.startswith('"', self.at):
            raise self.fail("a member's name (a string) was expected")
        key = self.string()
        self.space()
        if not self.text.startswith(":", self.at):
            raise self.fail("':' was expected after a member's name")
        self.at += 1
        return Member(key.scalar, key.start, key.end, self.value())


def parse(text: str) -> Document:
    """`text` as a tree of spans; `JsoncError` saying where it is not JSON(C)."""
    parser = _Parser(text)
    root = parser.value()
    parser.space()
    if parser.at != len(text):
        raise parser.fail("the text goes on after the value")
    where = None if parser.jsonc is None else position(text, parser.jsonc)
    return Document(text, root, where)
