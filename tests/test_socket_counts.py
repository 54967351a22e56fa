"""The open-socket counts (``ballast.sockets``), on the storage the run has: Redis
with ``REDIS_URL`` (as every coordinator process shares it), this process's
memory without. The consumers and real processes around them:
tests/e2e/test_access.py."""

from __future__ import annotations

import time

import pytest

from ballast.sockets import (
    SocketCap,
    _counts,
    socket_forget,
    socket_release,
    socket_take,
    sockets_renew,
)

MACHINE = SocketCap("machine", "m-1", "BALLAST_SOCKETS_PER_MACHINE")
ADDRESS = SocketCap("address", "192.0.2.7", "BALLAST_SOCKETS_PER_ADDRESS")


@pytest.fixture
def caps(settings):
    settings.BALLAST_SOCKETS_PER_MACHINE = 2
    settings.BALLAST_SOCKETS_PER_ADDRESS = 3
    return settings


def test_it_counts_a_socket_in_all_its_caps_or_in_none(caps) -> None:
    held = [socket_take([MACHINE, ADDRESS])[0] for _ in range(2)]
    assert all(held)
    refused, full = socket_take([MACHINE, ADDRESS])
    assert refused is None and full == MACHINE
    # the refusal took no place of the address: its third is still free
    other = SocketCap("machine", "m-2", "BALLAST_SOCKETS_PER_MACHINE")
    third, full = socket_take([other, ADDRESS])
    assert third and full is None
    assert socket_take([other, ADDRESS]) == (None, ADDRESS)
    # an ended socket frees its places at once
    socket_release(held[0], socket_forget(held[0]))
    assert socket_take([MACHINE, ADDRESS])[0]


def test_a_socket_nobody_renews_stops_counting_after_its_lease(caps) -> None:
    """What a process that died leaves: places nobody renews or releases."""
    caps.BALLAST_SOCKETS_PER_MACHINE = 1
    caps.BALLAST_SOCKET_LEASE_S = 1.0
    orphan, _ = socket_take([MACHINE])
    socket_forget(orphan)  # its process is gone: no renewal, no release
    assert socket_take([MACHINE]) == (None, MACHINE)
    deadline = time.monotonic() + 10
    while socket_take([MACHINE])[0] is None:
        assert time.monotonic() < deadline, "the orphan's place never came free"
        time.sleep(0.05)
    assert time.monotonic() - (deadline - 10) >= 0.5  # not before its lease


def test_renewals_count_the_live_sockets_again_after_redis_forgot_them(
    caps,
) -> None:
    """A Redis restart empties the counts; the next renewal puts this
    process's live sockets back."""
    if not caps.REDIS_URL:
        pytest.skip("needs REDIS_URL: the embedded default counts in memory")
    caps.BALLAST_SOCKETS_PER_MACHINE = 1
    live, _ = socket_take([MACHINE])
    assert live
    redis = _counts().redis
    for key in redis.scan_iter("ballast:sockets:*:machine:m-1"):
        redis.delete(key)
    sockets_renew()
    assert socket_take([MACHINE]) == (None, MACHINE)
