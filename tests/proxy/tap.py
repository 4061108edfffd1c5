"""A stdio tap: `python tap.py [--arguments] COUNT_FILE -- COMMAND ARGS...` runs COMMAND with its
stdin and stdout passed through, and appends one line to COUNT_FILE (fsynced) for every
`tools/call` request written to it: the upstream link's own count, for servers we cannot
instrument (npm packages). The line is the tool's name; with `--arguments`, a JSON object of the
name and the call's arguments (which logical call each delivery was, for a server whose own state
cannot show a second run). When its own input closes, it closes COMMAND's and stops it
(terminated if it lingers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

#: Seconds the child gets to exit after its input closes, and again after SIGTERM.
GRACE = 2.0


def _count(path: str, line: bytes, arguments: bool) -> None:
    try:
        message = json.loads(line)
    except ValueError:
        return
    if isinstance(message, dict) and message.get("method") == "tools/call":
        params = message.get("params", {})
        name = params.get("name", "")
        shown = (
            json.dumps({"name": name, "arguments": params.get("arguments")}) if arguments else name
        )
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{shown}\n")
            f.flush()
            os.fsync(f.fileno())


def main() -> int:
    words = sys.argv[1:]
    arguments = words[:1] == ["--arguments"]
    count_file, separator, *command = words[1:] if arguments else words
    assert separator == "--" and command, "usage: tap.py [--arguments] COUNT_FILE -- COMMAND..."
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    to_child, from_child = child.stdin, child.stdout

    def pump_out() -> None:
        for line in iter(from_child.readline, b""):
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()

    threading.Thread(target=pump_out, daemon=True).start()
    for line in iter(sys.stdin.buffer.readline, b""):
        # Counted before it is written: a count never lags the upstream.
        _count(count_file, line, arguments)
        to_child.write(line)
        to_child.flush()
    to_child.close()
    return _stop(child)


def _stop(child: subprocess.Popen[bytes]) -> int:
    """Stop the child as MCP's stdio transport says a client does once its input is closed: wait
    a moment, then SIGTERM, then SIGKILL. Some servers never exit on their own (`-everything`
    keeps an interval timer), and a server left behind holds the test run's output pipes."""
    for stop in (None, child.terminate, child.kill):
        if stop is not None:
            stop()
        try:
            return child.wait(timeout=GRACE)
        except subprocess.TimeoutExpired:
            continue
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
