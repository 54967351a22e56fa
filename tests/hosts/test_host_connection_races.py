"""A host's connection racing the coordinator: two hellos of one machine that
deadlock (the victim retried and welcomed), and an offer that reaches a
connection as it closes (answered "host gone" at once)."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async

from hosts.models import Machine


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_hello_chosen_as_a_deadlocks_victim_is_recorded_on_a_retry(
    catalog, machine_token, monkeypatch
):
    """Two connections of one machine saying hello at once can deadlock with
    each other's device locks (found with two agents on one token): the victim,
    rolled back whole, is sent again and the host is welcomed."""
    from django.db import OperationalError
    from psycopg import errors

    from hosts import services
    from tests.hostsim import HostSim

    real_hello = services.machine_hello
    calls = []

    def deadlocked_once(**kwargs):
        calls.append(kwargs["machine_id"])
        if len(calls) == 1:
            try:
                raise errors.DeadlockDetected("deadlock detected")
            except errors.DeadlockDetected as exc:
                raise OperationalError("deadlock detected") from exc
        return real_hello(**kwargs)

    monkeypatch.setattr(services, "machine_hello", deadlocked_once)
    machine, token = await database_sync_to_async(machine_token)("rig")
    host = HostSim(token)
    welcome = await host.connect()
    assert welcome["machine_id"] == str(machine.id) and len(calls) == 2
    assert (await Machine.objects.aget(id=machine.id)).connected
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_offer_that_reaches_a_closing_connection_is_answered_at_once(
    catalog, machine_token, monkeypatch
):
    """A request step picked the machine as its connection closed: the offer,
    waiting for the closing handler or sent just after, is answered "host gone"
    at once (the job moves on) instead of after the 5 s claim deadline."""
    import threading

    from channels.layers import get_channel_layer

    from ballast import local
    from hosts import services
    from tests.hostsim import HostSim

    machine, token = await database_sync_to_async(machine_token)("rig")
    host = HostSim(token)
    await host.connect()
    machine = await Machine.objects.aget(id=machine.id)
    layer = get_channel_layer()
    replies: list[dict] = []
    answered = asyncio.Event()

    def reply(message):
        replies.append(message)
        answered.set()

    local.reader_add("job.test-reply", reply)
    closing, go_on = threading.Event(), threading.Event()
    real_disconnect = services.machine_disconnect

    def slow_disconnect(**kwargs):
        closing.set()
        go_on.wait(10)
        return real_disconnect(**kwargs)

    monkeypatch.setattr(services, "machine_disconnect", slow_disconnect)

    def offer(attempt):
        return {
            "type": "attempt.offer",
            "attempt": attempt,
            "reply": "job.test-reply",
            "frame": {"type": "offer", "job": attempt},
        }

    try:
        closed = asyncio.ensure_future(host.close())
        assert await asyncio.to_thread(closing.wait, 5)
        # the disconnect handler runs: this offer waits for it, then the close
        await local.channel_send(layer, machine.channel_name, offer("during"))
        go_on.set()
        await closed
        await asyncio.wait_for(answered.wait(), 5)
        answered.clear()
        # and one sent after the close
        await local.channel_send(layer, machine.channel_name, offer("after"))
        await asyncio.wait_for(answered.wait(), 5)
    finally:
        go_on.set()
        local.reader_remove("job.test-reply", reply)
    assert [(r["type"], r["attempt"]) for r in replies] == [
        ("host.gone", "during"),
        ("host.gone", "after"),
    ]
