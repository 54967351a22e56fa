"""Process-local delivery (``ballast.local``): a job and its machine's connection in
one process skip the channel layer; the text, order and bounds stay the layer's."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.test import AsyncClient

import jobs.orchestration.inbox  # noqa: F401
from ballast import local
from jobs import orchestration
from tests.hostsim import MODEL

from .helpers import host_online, read_body, sse_events, sse_text
from .test_relay_path import _follow, _frames, _run, _segment


@pytest.mark.asyncio
async def test_local_tokens_join_in_order_and_free_the_bound_when_read():
    run, segment = _run(), _segment()
    other = str(uuid.uuid4())
    for message in _frames(
        segment,
        ("claim",),
        ("token", "a"),
        ("token", "bc"),
        ("token", "late", other),
        ("token", "d"),
        ("done",),
    ):
        run.inbox.deliver(message)
    assert [m.get("text") for m in run.inbox] == [None, "abc", "late", "d", None]
    assert run.inbox.chars == 8
    assert await _follow(run, segment) == ["abc", "d"]
    assert segment.text == "abcd" and run.inbox.chars == 0


@pytest.mark.asyncio
async def test_a_backlog_past_the_bound_refuses_the_token(monkeypatch):
    monkeypatch.setattr(orchestration.inbox, "LOCAL_INBOX_CHARS", 10)
    run, segment = _run(), _segment()
    run.inbox.deliver(_frames(segment, ("token", "123456"))[0])
    with pytest.raises(ChannelFull):
        run.inbox.deliver(_frames(segment, ("token", "12345"))[0])
    assert [m["text"] for m in run.inbox] == ["123456"], "the refused text is not kept"
    run.inbox.deliver(_frames(segment, ("token", "1234"))[0])  # what fits still does
    assert run.inbox.chars == 10


@pytest.mark.asyncio
async def test_channel_send_is_local_only_for_a_reader_on_this_loop(settings):
    layer = get_channel_layer()
    got: list[dict] = []
    here = await layer.new_channel("job.")
    local.reader_add(here, got.append)
    try:
        await local.channel_send(layer, here, {"type": "x", "n": 1})
        assert got == [{"type": "x", "n": 1}]
        settings.BALLAST_LOCAL_DELIVERY = False
        await local.channel_send(layer, here, {"type": "x", "n": 2})
        assert got == [{"type": "x", "n": 1}], "with the shortcut off: the layer"
        assert (await layer.receive(here))["n"] == 2
    finally:
        local.reader_remove(here, got.append)

    # a reader registered on another event loop (another thread) gets the layer
    settings.BALLAST_LOCAL_DELIVERY = True
    elsewhere = await layer.new_channel("job.")
    try:
        await asyncio.to_thread(asyncio.run, _register(elsewhere, got.append))
        await local.channel_send(layer, elsewhere, {"type": "x", "n": 3})
        assert got == [{"type": "x", "n": 1}]
        assert (await layer.receive(elsewhere))["n"] == 3
    finally:
        local.reader_remove(elsewhere, got.append)


@pytest.mark.asyncio
async def test_a_job_channel_is_read_through_its_process_mailbox(settings):
    """Through the layer (the shortcut off, as from another process), a job's
    channel gets its messages by way of the process's one mailbox, in order,
    those sent before its reader was added included; one for a channel given
    back is dropped and the mailbox reads on."""
    settings.BALLAST_LOCAL_DELIVERY = False
    layer = get_channel_layer()
    channel = await local.channel_new(layer)
    assert (
        channel.rpartition(".")[0]
        == (await local.channel_new(layer)).rpartition(".")[0]
    )
    got: list[int] = []
    both = asyncio.Event()

    def deliver(message: dict) -> None:
        got.append(message["n"])
        if len(got) == 2:
            both.set()

    await local.channel_send(layer, channel, {"type": "x", "n": 1})
    local.reader_add(channel, deliver)
    await local.channel_send(layer, channel, {"type": "x", "n": 2})
    await asyncio.wait_for(both.wait(), 5)
    assert got == [1, 2]
    local.reader_drop(channel)
    await local.channel_send(layer, channel, {"type": "x", "n": 3})
    later = await local.channel_new(layer)
    arrived = asyncio.Event()
    local.reader_add(later, lambda message: arrived.set())
    await local.channel_send(layer, later, {"type": "x", "n": 4})
    await asyncio.wait_for(arrived.wait(), 5)
    assert got == [1, 2]
    local.reader_drop(later)


async def _register(channel, deliver) -> None:
    local.reader_add(channel, deliver)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("shortcut", [True, False], ids=["local", "layer"])
async def test_an_answer_is_relayed_exactly_either_way(
    shortcut, settings, catalog, api_key, machine_token
):
    """The same streamed answer with the shortcut on (nothing of the job crosses the
    layer) and off (everything does): same text, same order."""
    settings.BALLAST_LOCAL_DELIVERY = shortcut
    layer = get_channel_layer()
    sent_through_layer: list[str] = []
    real_send = layer.send

    async def layer_send(channel, message):
        sent_through_layer.append(message["type"])
        await real_send(channel, message)

    host = await host_online(machine_token, "rig")
    layer.send = layer_send
    try:
        request = asyncio.create_task(
            AsyncClient().post(
                "/v1/chat/completions",
                data={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "Count"}],
                    "stream": True,
                },
                content_type="application/json",
                headers={"authorization": f"Bearer {api_key}"},
            )
        )
        offer = await host.recv_type("offer")
        pieces = [" one", " two", " thr", "ee", " é", "🦙"]
        await host.answer(offer, pieces)
        response = await request
        assert response.status_code == 200
        assert sse_text(sse_events(await read_body(response))) == "".join(pieces)
    finally:
        layer.send = real_send
        await host.close()
    relayed = [t for t in sent_through_layer if t.startswith(("attempt.", "host."))]
    if shortcut:
        assert relayed == [], "a job and its host in one process skip the layer"
    else:
        assert "attempt.offer" in relayed and relayed.count("host.token") >= 1
        assert "host.done" in relayed
