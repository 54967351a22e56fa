"""Helpers of the tests that drive ``ballast.asgi``'s application directly (the
production ASGI path, not Django's test client)."""

from __future__ import annotations


def http_scope(path: str, headers: list) -> dict:
    """An ASGI HTTP scope of a POST to ``path`` from 127.0.0.1 to ``testserver``;
    ``headers``: (name, value) byte pairs after ``host``."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
