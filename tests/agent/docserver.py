"""A documented-exchange double: a real HTTP server on 127.0.0.1 that answers
with exchanges shaped as a server's API documentation shows them.

Ollama and vLLM cannot run here (no GPU, no binaries), so their engines are
tested against the exchanges of their documentation, kept as JSON lines in
``tests/agent/exchanges/<server>.jsonl``: one exchange per line, ``{"name",
"source" (where the documentation shows it), "method", "path", "status",
"type" ("json", "ndjson" or "sse"), "body" (json) or "lines" (ndjson/sse)}``.
A test names the exchanges it plays; each request takes the first unplayed
exchange of its method and path, and is recorded (``requests``). A request no
exchange answers gets 404 and is recorded too.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

EXCHANGES = Path(__file__).parent / "exchanges"


def exchanges(server: str, *names: str, **edits: Any) -> list[dict[str, Any]]:
    """The named exchanges of ``exchanges/<server>.jsonl``, in the order named
    (a name may repeat). ``edits``: ``name={key: value}`` replaced in that
    exchange's ``body`` (a copy)."""
    known: dict[str, dict[str, Any]] = {}
    for line in (EXCHANGES / f"{server}.jsonl").read_text().splitlines():
        if line.strip():
            exchange = json.loads(line)
            known[exchange["name"]] = exchange
    chosen = []
    for name in names:
        exchange = json.loads(json.dumps(known[name]))
        if name in edits:
            exchange["body"].update(edits[name])
        chosen.append(exchange)
    return chosen


class DocServer:
    """Serves ``exchanges`` on 127.0.0.1 (a free port) in a thread; a context
    manager. ``url`` is its base URL; ``requests`` the ``(method, path, body)``
    received, body parsed from JSON (None when empty)."""

    def __init__(self, played: list[dict[str, Any]]) -> None:
        self.pending = list(played)
        self.requests: list[tuple[str, str, Any]] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def bodies(self, path: str) -> list[Any]:
        """The bodies of the requests to ``path``, in order."""
        return [body for _, p, body in self.requests if p == path]

    def __enter__(self) -> DocServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _take(self, method: str, path: str, body: Any) -> dict[str, Any] | None:
        with self._lock:
            self.requests.append((method, path, body))
            for index, exchange in enumerate(self.pending):
                if exchange["method"] == method and exchange["path"] == path:
                    return self.pending.pop(index)
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # a streamed body ends when we close

            def log_message(self, *args: object) -> None:
                pass

            def _serve(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(size) if size else b""
                body = json.loads(raw) if raw else None
                exchange = double._take(self.command, self.path, body)
                if exchange is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                kind = exchange.get("type", "json")
                self.send_response(exchange.get("status", 200))
                self.send_header(
                    "Content-Type",
                    {
                        "json": "application/json",
                        "ndjson": "application/x-ndjson",
                        "sse": "text/event-stream",
                    }[kind],
                )
                self.end_headers()
                for chunk in _chunks(exchange, kind):
                    self.wfile.write(chunk)
                    self.wfile.flush()

            do_GET = _serve
            do_POST = _serve

        return Handler


def _chunks(exchange: dict[str, Any], kind: str) -> Iterator[bytes]:
    """The response body, one written piece per line of a stream."""
    if kind == "json":
        yield json.dumps(exchange["body"]).encode()
        return
    for line in exchange["lines"]:
        text = line if isinstance(line, str) else json.dumps(line)
        yield (f"data: {text}\n\n" if kind == "sse" else f"{text}\n").encode()
