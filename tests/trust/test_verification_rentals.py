"""A rental's answers are never verified (the fresh-eyes review): its renter
rents that device, so its prompts and answers go to no other owner's device."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from hosts.services import machine_create
from jobs.models import Job, Verification
from tests.hostsim import HostSim
from tests.jobs.helpers import chat_request
from tests.jobs.test_rentals import _passing_host, _rent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_a_rentals_answer_is_sent_to_no_verifier(
    canaries, api_key, machine_token, settings
):
    settings.BALLAST_VERIFY_RATE = 1.0
    settings.BALLAST_VERIFIER_CHECKS = False
    rented = await _passing_host(machine_token, "rented")
    rental = await _rent(rented, api_key)
    _, token = await database_sync_to_async(machine_create)(
        owner_email="stranger@example.com", name="s"
    )
    stranger = HostSim(token, verifies=True)
    await stranger.connect()
    await stranger.heartbeat()
    request = chat_request(
        api_key,
        stream=False,
        placement={"rental": str(rental.id)},
        content="my private rental prompt",
    )
    offer = await rented.recv_type("offer")
    await rented.answer(offer, ["private answer"])
    assert (await request).status_code == 200
    job = await Job.objects.aget(attempts__id=offer["job"])
    assert job.rental_id == rental.id and job.status == "succeeded"
    heard = []
    while not await stranger.ws.receive_nothing(timeout=0.5):
        heard.append((await stranger.recv())["type"])
    assert "verify" not in heard, "the stranger is sent nothing of the rental's"
    assert not await Verification.objects.filter(job=job).aexists()
    await rented.close()
    await stranger.close()
