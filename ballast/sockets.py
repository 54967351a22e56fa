"""Open websockets per subject (a machine, an API key, a client address), capped
(DESIGN.md "Limits and abuse"; docs/protocol-notes.md "Access").

Counted in Redis with ``REDIS_URL``, so every coordinator process shares the
counts; in this process's memory on the embedded default (one process). Each
subject is a sorted set of connection ids, each scored with the time its entry
lapses (Redis's clock, ms); taking a place first drops the lapsed entries. A
process renews the entries of its open sockets every third of
``BALLAST_SOCKET_LEASE_S`` from a thread of its own, and removes an entry when
its socket ends: the sockets of a process that died (SIGKILL, a lost machine)
stop counting within one lease, and a live socket never lapses (after a Redis
restart, which forgets every count, the renewals count the live sockets
again). A socket that ends while its renewal is under way may count for one
more lease.

Keys are ``ballast:sockets:<installation>:<kind>:<id>``, the installation named
by its database (so two installations, or two test runs, sharing one Redis do
not count each other's sockets).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from dataclasses import dataclass

import redis
from django.conf import settings
from django.db import connections

log = logging.getLogger("ballast.sockets")

# KEYS: the subjects' sets; ARGV: lease (ms), connection id, then each set's cap.
# Returns 0 when the connection was counted in every set, else the 1-based index
# of the first full set (then it was counted in none).
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if redis.call('ZCARD', key) >= tonumber(ARGV[i + 2]) then return i end
end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now + lease, ARGV[2])
  redis.call('PEXPIRE', key, lease)
end
return 0
"""
# KEYS: sets; ARGV: lease (ms), then one connection id per key: added again
# where it is missing (a Redis that restarted counts the live sockets again)
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, now + lease, ARGV[i + 1])
  redis.call('PEXPIRE', key, lease)
end
return 0
"""
RENEW_BATCH = 500  # entries per renewal script call
REDIS_TIMEOUT_S = 5.0  # a Redis call's longest wait (s)


@dataclass(frozen=True)
class SocketCap:
    """One count a socket is held to: ``kind`` (``machine``, ``key``,
    ``address``), the subject's ``ident`` and ``setting``, the name of the
    setting holding the cap (open sockets, ≥ 1)."""

    kind: str
    ident: str
    setting: str

    @property
    def cap(self) -> int:
        """The cap now: the setting's value (open sockets)."""
        return getattr(settings, self.setting)


class _RedisCounts:
    """The counts in Redis (sorted sets, Redis's clock)."""

    def __init__(self, url: str) -> None:
        # a Redis that stops answering fails a connect in seconds, not never
        self.redis = redis.Redis.from_url(
            url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
        )
        self.take_script = self.redis.register_script(_TAKE)
        self.renew_script = self.redis.register_script(_RENEW)

    def take(self, keys: list[str], caps: list[int], member: str, lease_ms: int) -> int:
        return int(self.take_script(keys=keys, args=[lease_ms, member, *caps]))

    def renew(self, entries: list[tuple[str, str]], lease_ms: int) -> None:
        for start in range(0, len(entries), RENEW_BATCH):
            batch = entries[start : start + RENEW_BATCH]
            self.renew_script(
                keys=[key for key, _ in batch],
                args=[lease_ms, *(member for _, member in batch)],
            )

    def release(self, keys: list[str], member: str) -> None:
        with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.zrem(key, member)
            pipe.execute()


class _MemoryCounts:
    """The same counts in this process's memory (the embedded default)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sets: dict[str, dict[str, float]] = {}  # key -> member -> lapses at (s)

    def take(self, keys: list[str], caps: list[int], member: str, lease_ms: int) -> int:
        now = time.monotonic()
        with self.lock:
            for index, (key, cap) in enumerate(zip(keys, caps, strict=True), 1):
                members = self.sets.setdefault(key, {})
                for lapsed in [m for m, until in members.items() if until <= now]:
                    del members[lapsed]
                if len(members) >= cap:
                    return index
            for key in keys:
                self.sets[key][member] = now + lease_ms / 1000
            return 0

    def renew(self, entries: list[tuple[str, str]], lease_ms: int) -> None:
        until = time.monotonic() + lease_ms / 1000
        with self.lock:
            for key, member in entries:
                if member in self.sets.get(key, {}):
                    self.sets[key][member] = until

    def release(self, keys: list[str], member: str) -> None:
        with self.lock:
            for key in keys:
                members = self.sets.get(key, {})
                members.pop(member, None)
                if not members:
                    self.sets.pop(key, None)


_lock = threading.Lock()
_store: tuple[str, _RedisCounts | _MemoryCounts] | None = None
_open: dict[str, list[str]] = {}  # this process's sockets: connection id -> keys
_renewer: threading.Thread | None = None


def _counts() -> _RedisCounts | _MemoryCounts:
    """The process's counts, in Redis when ``REDIS_URL`` is set (made once per URL)."""
    global _store
    url = settings.REDIS_URL
    with _lock:
        if _store is None or _store[0] != url:
            _store = (url, _RedisCounts(url) if url else _MemoryCounts())
        return _store[1]


def _installation() -> str:
    """A short name of this installation: a hash of its database's address."""
    db = connections["default"].settings_dict
    where = f"{db.get('HOST') or ''}:{db.get('PORT') or ''}/{db.get('NAME') or ''}"
    return hashlib.sha256(where.encode()).hexdigest()[:12]


def _lease_ms() -> int:
    """``BALLAST_SOCKET_LEASE_S`` in ms."""
    return max(1, round(settings.BALLAST_SOCKET_LEASE_S * 1000))


def socket_take(caps: list[SocketCap]) -> tuple[str | None, SocketCap | None]:
    """Count one more open socket against each of ``caps``, all or none.

    Returns ``(connection id, None)`` when every count was under its cap (the
    id to give ``socket_release`` when the socket ends; this process renews it
    meanwhile), else ``(None, the first cap that is full)``. Blocking (one
    Redis round trip): call it from a worker thread in async code. Raises
    ``redis.RedisError`` when Redis cannot be reached.
    """
    prefix = f"ballast:sockets:{_installation()}:"
    keys = [f"{prefix}{cap.kind}:{cap.ident}" for cap in caps]
    member = uuid.uuid4().hex
    full = _counts().take(keys, [cap.cap for cap in caps], member, _lease_ms())
    if full:
        return None, caps[full - 1]
    with _lock:
        _open[member] = keys
    _renewer_start()
    return member, None


def socket_forget(connection_id: str) -> list[str]:
    """Stop renewing the socket ``connection_id`` (at once, without I/O);
    returns its keys for ``socket_release``."""
    with _lock:
        return _open.pop(connection_id, [])


def socket_release(connection_id: str, keys: list[str]) -> None:
    """The socket ``connection_id`` ended: remove it from its counts ``keys``
    (``socket_forget``'s). Blocking (one Redis round trip); raises
    ``redis.RedisError`` (its entries then lapse within a lease)."""
    if keys:
        _counts().release(keys, connection_id)


def sockets_reset() -> None:
    """Forget every count of this installation (tests)."""
    with _lock:
        _open.clear()
    counts = _counts()
    if isinstance(counts, _MemoryCounts):
        with counts.lock:
            counts.sets.clear()
        return
    for key in counts.redis.scan_iter(f"ballast:sockets:{_installation()}:*"):
        counts.redis.delete(key)


def _renewer_start() -> None:
    """Start the process's renewal thread once (a daemon: it ends with the process)."""
    global _renewer
    with _lock:
        if _renewer is not None and _renewer.is_alive():
            return
        _renewer = threading.Thread(
            target=_renew_forever, name="ballast-socket-leases", daemon=True
        )
        _renewer.start()


def sockets_renew() -> None:
    """Renew the entries of this process's open sockets for a lease (one turn
    of the renewal thread). Raises ``redis.RedisError`` when Redis is away."""
    with _lock:
        entries = [(key, member) for member, keys in _open.items() for key in keys]
    if entries:
        _counts().renew(entries, _lease_ms())


def _renew_forever() -> None:
    """``sockets_renew`` every third of the lease; a failure (Redis away) is
    logged and retried at the next turn."""
    while True:
        time.sleep(settings.BALLAST_SOCKET_LEASE_S / 3)
        try:
            sockets_renew()
        except redis.RedisError as exc:  # the entries lapse unless a turn succeeds
            log.warning("open sockets' leases not renewed: %s", exc)
