"""A small payment provider with Stripe's idempotency semantics, as a real HTTP service.

`uv run python examples/payment_provider.py --db charges.db` serves on 127.0.0.1 (a free port
unless `--port`) and prints `payment provider at http://127.0.0.1:PORT` on stderr once it listens.
It stands in for Stripe, Square or Adyen in `examples/reconcile.py`; it is also the tests' ledger
of charges, kept in its own SQLite file by its own process, which a guarded server cannot fake.

- `POST /v1/charges` with an `Idempotency-Key` header and `{"order": str, "amount": int}`: one
  charge per key. The same key again returns the same charge (`Idempotent-Replayed: true`); the
  same key with other parameters is refused (400), as Stripe refuses it.
- `GET /v1/charges/by-key/<key>`: the charge made under that key, or 404: how a reconciler asks
  whether an effect happened.
- `GET /v1/charges`: every charge (`{"data": [...]}`), oldest first, each with `requests`: how
  many charge requests came with its key (Stripe does not say; the tests count with it).

`ProviderClient` is the async client the example's tool and reconciler use.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sqlite3
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib import request
from urllib.error import HTTPError
from urllib.parse import quote, unquote

import anyio
import anyio.to_thread

#: Stripe accepts idempotency keys of up to 255 characters.
MAX_KEY_LENGTH = 255
BY_KEY = "/v1/charges/by-key/"


class Charges:
    """The provider's book of charges: one row per idempotency key, in SQLite."""

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS charges (n INTEGER PRIMARY KEY, key TEXT UNIQUE,"
            " order_id TEXT, amount INTEGER, requests INTEGER)"
        )

    def charge(self, key: str, order: str, amount: int) -> tuple[dict[str, Any] | None, bool]:
        """(the charge, whether it was made before under `key`); None: `key` was used with other
        parameters."""
        with self._lock:
            found = self.find(key)
            if found is not None:
                self._db.execute("UPDATE charges SET requests = requests + 1 WHERE key = ?", (key,))
                same = (found["order"], found["amount"]) == (order, amount)
                return (found if same else None), True
            self._db.execute(
                "INSERT INTO charges (key, order_id, amount, requests) VALUES (?, ?, ?, 1)",
                (key, order, amount),
            )
            made = self.find(key)
            assert made is not None
            return made, False

    def find(self, key: str) -> dict[str, Any] | None:
        row = self._db.execute(
            "SELECT n, key, order_id, amount, requests FROM charges WHERE key = ?", (key,)
        ).fetchone()
        return None if row is None else _charge(row)

    def all(self) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT n, key, order_id, amount, requests FROM charges ORDER BY n")
        return [_charge(row) for row in rows.fetchall()]


def _charge(row: tuple[Any, ...]) -> dict[str, Any]:
    n, key, order, amount, requests = row
    return {
        "id": f"ch_{n}",
        "idempotency_key": key,
        "order": order,
        "amount": amount,
        # How many charge requests came with this key (the first one included): a retry that
        # reached the provider again shows here, although it charged nothing.
        "requests": requests,
    }


def handler_for(charges: Charges) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None  # quiet: the example prints what matters

        def _send(self, status: int, body: object, replayed: bool = False) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if replayed:
                self.send_header("Idempotent-Replayed", "true")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/v1/charges":
                self._send(200, {"data": charges.all()})
            elif self.path.startswith(BY_KEY):
                found = charges.find(unquote(self.path[len(BY_KEY) :]))
                self._send(404, {"error": "no such charge"}) if found is None else self._send(
                    200, found
                )
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            if self.path != "/v1/charges":
                self._send(404, {"error": "not found"})
                return
            key = self.headers.get("Idempotency-Key", "")
            if not 0 < len(key) <= MAX_KEY_LENGTH:
                self._send(400, {"error": f"Idempotency-Key: 1..{MAX_KEY_LENGTH} characters"})
                return
            sent = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            made, replayed = charges.charge(key, str(sent["order"]), int(sent["amount"]))
            if made is None:
                self._send(400, {"error": "this key was used with other parameters"})
                return
            self._send(200, made, replayed)

    return Handler


class ProviderClient:
    """The provider's API as a guarded tool and its reconciler call it (stdlib HTTP, each
    request in a worker thread so the server's event loop keeps serving)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _request(
        self, method: str, path: str, body: object = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        sent = request.Request(f"{self.url}{path}", data=data, method=method)
        sent.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            sent.add_header(name, value)
        try:
            with request.urlopen(sent, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except HTTPError as refused:
            return refused.code, json.loads(refused.read() or b"null")

    async def charge(self, key: str, order: str, amount: int) -> dict[str, Any]:
        body = {"order": order, "amount": amount}
        call = functools.partial(
            self._request, "POST", "/v1/charges", body, {"Idempotency-Key": key}
        )
        status, made = await anyio.to_thread.run_sync(call)
        if status != 200:
            raise RuntimeError(f"the provider refused the charge ({status})")
        return dict(made)

    async def find(self, key: str) -> dict[str, Any] | None:
        """The charge made under `key`, or None: there is none (any other failure raises)."""
        call = functools.partial(self._request, "GET", f"{BY_KEY}{quote(key, safe='')}")
        status, found = await anyio.to_thread.run_sync(call)
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError(f"the provider could not look the charge up ({status})")
        return dict(found)

    def charges(self) -> list[dict[str, Any]]:
        """Every charge the provider holds (blocking: for a script or a test to count)."""
        status, listed = self._request("GET", "/v1/charges")
        assert status == 200
        return list(listed["data"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, required=True, help="the charges' SQLite file")
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler_for(Charges(args.db)))
    print(f"payment provider at http://127.0.0.1:{server.server_port}", file=sys.stderr, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
