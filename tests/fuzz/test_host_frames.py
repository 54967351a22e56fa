"""A connected machine sending fuzzed ``ballast.host.v1`` frames (issue 26, item
5): random types, fields, sizes, encodings and orders, frames for its own
attempts and for another machine's, on the real ASGI application, while an
honest machine streams an answer to a renter. Nothing may be a coordinator
error, every refusal is as docs/protocol-notes.md says, the honest renter gets
its exact answer billed once, the ledger balances (``tests.fuzz.host_run``).
``tests.fuzz.knobs`` bounds it (25 programs, a fixed sequence); the long form
is ``bench/fuzz.py host``."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings

from . import knobs
from .host_frames import programs
from .host_run import example_run, world_close, world_open

pytestmark = [
    pytest.mark.fuzz,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
]


@pytest.fixture
def fuzz_settings(settings):
    """Deadlines an honest host meets whatever its neighbour sends; a request
    the fuzzing machine leaves waiting ends soon; no spot checks, no key rate."""
    settings.BALLAST_CLAIM_TIMEOUT_S = 2.0
    settings.BALLAST_FIRST_TOKEN_TIMEOUT_S = 5.0
    settings.BALLAST_STALL_TIMEOUT_S = 10.0
    settings.BALLAST_QUEUE_TIMEOUT_S = 2.0
    settings.BALLAST_CANCEL_RECEIPT_WAIT_S = 0.5
    settings.BALLAST_SPOT_CHECKS = False
    settings.BALLAST_KEY_RATE = "100000/minute"
    return settings


async def test_fuzzed_frames_never_hurt_the_coordinator_or_another_machine(
    catalog, api_key, machine_token, fuzz_settings
):
    world = await world_open(machine_token=machine_token, api_key=api_key)
    loop = asyncio.get_running_loop()

    @hypothesis_settings(
        max_examples=knobs.examples(),
        deadline=None,
        derandomize=not knobs.random_sequence(),
        database=None,
        phases=[Phase.generate],  # no shrinking: the failing program is printed whole
        suppress_health_check=list(HealthCheck),
    )
    @given(program=programs)
    def one_program(program):
        asyncio.run_coroutine_threadsafe(example_run(world, program), loop).result()

    try:
        await loop.run_in_executor(None, one_program)
    finally:
        await world_close(world)
    print(dict(world.counts))
