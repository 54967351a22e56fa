"""The protocol client against a fake coordinator (websockets server on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
from typing import Any

import pytest

from agent import __version__
from agent.receipts import receipt_verify

pytestmark = []

MODEL = "smollm2-135m-instruct"


def assert_receipt(
    hello: dict[str, Any], job: str, done: dict[str, Any], text: str
) -> None:
    assert receipt_verify(
        hello["public_key"],
        done["receipt"],
        job,
        done["usage"]["completion_tokens"],
        text,
    ), "the receipt does not verify over the exact text sent"


@pytest.mark.asyncio
async def test_it_says_hello_and_heartbeats(coordinator, agent_start) -> None:
    agent = await agent_start(coordinator, slots=2)
    hello = coordinator.hellos[0]
    assert hello["type"] == "hello"
    assert hello["agent_version"] == __version__
    assert hello["engine"] == {"name": "scripted", "version": __version__}
    assert len(base64.b64decode(hello["public_key"])) == 32
    assert hello["accepts_serverless"] is True
    device = hello["devices"][0]
    assert device["index"] == 0 and isinstance(device["name"], str) and device["name"]
    assert isinstance(device["vram_total_mb"], int) and device["vram_total_mb"] > 0
    assert coordinator.headers[0]["Authorization"] == "Bearer machine-token"
    assert coordinator.headers[0]["Sec-WebSocket-Protocol"] == "ballast.host.v1"
    assert agent.machine_id == "machine-1"

    first = await coordinator.heartbeat()
    assert first["paused"] is False
    [status] = [d for d in first["devices"] if d["index"] == 0]
    assert status["loaded_models"] == [MODEL]
    assert status["slots"] == 2
    assert isinstance(status["vram_free_mb"], int)
    assert status["temp_c"] is None or isinstance(status["temp_c"], (int, float))
    await coordinator.heartbeat()  # and again after heartbeat_interval_s (0.2 s)


@pytest.mark.asyncio
async def test_it_claims_streams_and_signs_the_exact_text(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(coordinator, script={"pieces": ["Café", " 😀", " four."]})
    await coordinator.send(offer_frame("job-1"))
    await coordinator.expect("claim", job="job-1")
    text, done = await coordinator.stream_collect("job-1")
    assert text == "Café 😀 four."
    assert done["finish_reason"] == "stop"
    assert done["usage"]["completion_tokens"] == 3
    assert_receipt(coordinator.hellos[0], "job-1", done, text)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "pieces", [["\x00", "hi", "\x00", "!"], ["hi\x00", "\x00!\x00"]]
)
async def test_nul_characters_of_the_engine_are_dropped_and_the_rest_signed(
    coordinator, agent_start, offer_frame, pieces
) -> None:
    """The coordinator refuses a token holding NUL (PostgreSQL text cannot store
    it): the agent drops them, so its frames pass and the receipt signs exactly
    the text sent (an honest host is paid)."""
    await agent_start(coordinator, script={"pieces": pieces})
    await coordinator.send(offer_frame("job-1"))
    await coordinator.expect("claim", job="job-1")
    text, done = await coordinator.stream_collect("job-1")
    assert text == "hi!"
    assert_receipt(coordinator.hellos[0], "job-1", done, text)


@pytest.mark.asyncio
async def test_pieces_an_engine_yields_at_once_leave_as_one_frame(
    coordinator, agent_start, offer_frame
) -> None:
    """Pieces yielded within one turn of the agent's loop would leave in one
    write anyway: they go as one token frame (the first with the claim)."""
    pieces = [f" w{i}" for i in range(20)]
    await agent_start(coordinator, script={"pieces": pieces})
    await coordinator.send(offer_frame("j"))
    await coordinator.expect("claim", job="j")
    assert (await coordinator.expect("token", job="j"))["text"] == " w0"
    assert (await coordinator.expect("token", job="j"))["text"] == "".join(pieces[1:])
    done = await coordinator.expect("done", job="j")
    assert done["usage"]["completion_tokens"] == 20
    assert_receipt(coordinator.hellos[0], "j", done, "".join(pieces))


@pytest.mark.asyncio
async def test_pieces_that_come_apart_leave_apart(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(coordinator, script={"pieces": ["a", "b", "c"], "delay_s": 0.01})
    await coordinator.send(offer_frame("j"))
    await coordinator.expect("claim", job="j")
    for piece in ("a", "b", "c"):
        assert (await coordinator.expect("token", job="j"))["text"] == piece
    done = await coordinator.expect("done", job="j")
    assert_receipt(coordinator.hellos[0], "j", done, "abc")


@pytest.mark.asyncio
async def test_a_frame_joins_at_most_max_pieces(
    coordinator, agent_start, offer_frame
) -> None:
    from agent.outbox import Outbox as _Outbox

    pieces = [f" w{i}" for i in range(2 * _Outbox.MAX_PIECES + 22)]
    await agent_start(coordinator, script={"pieces": pieces})
    await coordinator.send(offer_frame("j", params={"max_tokens": len(pieces)}))
    await coordinator.expect("claim", job="j")
    frames = []
    while (frame := await coordinator.frames.get())["type"] == "token":
        frames.append(frame["text"])
    assert frame["type"] == "done"
    assert "".join(frames) == "".join(pieces)
    assert [text.count(" w") for text in frames] == [1, 64, 64, 21]
    assert_receipt(coordinator.hellos[0], "j", frame, "".join(pieces))


@pytest.fixture
def sends(monkeypatch) -> list[tuple[tuple[str, ...], bool]]:
    """Each ``Session.send`` of the agent: its frames' types, and whether the
    socket's output was held (TCP_CORK) while they were written."""
    from agent import session

    calls: list[tuple[tuple[str, ...], bool]] = []
    real_corked = session.corked

    @contextlib.contextmanager
    def corked(ws, cork):
        with real_corked(ws, cork):
            sock = ws.transport.get_extra_info("socket")
            held = bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK))
            calls[-1] = (calls[-1][0], held)
            yield

    real_send = session.Session.send

    async def send(self, *frames):
        calls.append((tuple(f["type"] for f in frames), False))
        await real_send(self, *frames)

    monkeypatch.setattr(session, "corked", corked)
    monkeypatch.setattr(session.Session, "send", send)
    return calls


@pytest.mark.asyncio
@pytest.mark.skipif(not hasattr(socket, "TCP_CORK"), reason="Linux's TCP_CORK")
async def test_a_claim_leaves_with_a_first_piece_that_is_ready(
    coordinator, agent_start, offer_frame, sends
) -> None:
    """Claim and first token in one write, the socket's output held: one TCP
    segment, so the coordinator wakes once for both."""
    await agent_start(coordinator, script={"pieces": ["Four", "."]})
    await coordinator.send(offer_frame("job-1"))
    await coordinator.expect("claim", job="job-1")
    assert (await coordinator.expect("token", job="job-1"))["text"] == "Four"
    await coordinator.expect("token", job="job-1")
    await coordinator.expect("done", job="job-1")
    jobs = [call for call in sends if call[0] not in (("hello",), ("heartbeat",))]
    assert jobs == [
        (("claim", "token"), True),
        (("token",), False),
        (("done",), False),
    ]


@pytest.mark.asyncio
@pytest.mark.skipif(not hasattr(socket, "TCP_CORK"), reason="Linux's TCP_CORK")
async def test_a_claim_does_not_wait_for_a_slow_first_piece(
    coordinator, agent_start, offer_frame, sends
) -> None:
    """An engine slower than ``CLAIM_WITH_FIRST_PIECE_S`` (here 1 s a piece): the
    claim leaves alone, the piece after it."""
    await agent_start(coordinator, script={"pieces": ["Four"], "delay_s": 1.0})
    await coordinator.send(offer_frame("job-1"))
    await coordinator.expect("claim", job="job-1")
    assert coordinator.frames.empty()  # the claim came ahead of the piece
    await coordinator.expect("token", job="job-1")
    await coordinator.expect("done", job="job-1")
    jobs = [call for call in sends if call[0] not in (("hello",), ("heartbeat",))]
    assert jobs == [(("claim",), False), (("token",), False), (("done",), False)]


@pytest.mark.asyncio
async def test_the_receipt_of_a_continuation_covers_only_the_new_text(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(coordinator, script={"pieces": ["ea", " is wide."]})
    await coordinator.send(offer_frame("job-2", continue_from="The s"))
    await coordinator.expect("claim", job="job-2")
    text, done = await coordinator.stream_collect("job-2")
    assert text == "ea is wide."
    assert_receipt(coordinator.hellos[0], "job-2", done, text)


@pytest.mark.asyncio
async def test_cancel_stops_the_stream_and_frees_the_slot(
    coordinator, agent_start, offer_frame
) -> None:
    """After cancel no frame of the job follows; the one slot takes the next offer."""
    await agent_start(
        coordinator,
        slots=1,
        script={"pieces": [f" w{i}" for i in range(200)], "delay_s": 0.02},
    )
    await coordinator.send(offer_frame("long"))
    await coordinator.expect("claim", job="long")
    await coordinator.expect("token", job="long")
    await coordinator.send({"type": "cancel", "job": "long"})
    await coordinator.send(offer_frame("next", params={"max_tokens": 5}))
    while True:  # tokens already in flight before the cancel may still arrive
        frame = await asyncio.wait_for(coordinator.frames.get(), 10)
        if frame["job"] == "next":
            assert frame["type"] == "claim"
            break
        if frame["type"] == "cancelled":  # the answer to the cancel (its receipt)
            continue
        assert frame == {"type": "token", "job": "long", "text": frame["text"]}
    text, done = await coordinator.stream_collect("next")  # no "long" frame in between
    assert text == " w0 w1 w2 w3 w4"
    assert done["finish_reason"] == "length"


@pytest.mark.asyncio
async def test_an_offer_without_a_free_slot_gets_an_error_and_no_claim(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(coordinator, slots=1, script={"mode": "claim_then_silent"})
    await coordinator.send(offer_frame("busy"))
    await coordinator.expect("claim", job="busy")
    await coordinator.send(offer_frame("extra"))
    error = await coordinator.expect("error", job="extra")
    assert "slot" in error["message"]
    await coordinator.send({"type": "cancel", "job": "busy"})
    await coordinator.expect("cancelled", job="busy")  # nothing sent: an empty receipt
    await coordinator.send(offer_frame("after"))
    await coordinator.expect("claim", job="after")


@pytest.mark.asyncio
async def test_two_slots_run_two_jobs_at_once(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(
        coordinator, slots=2, script={"pieces": ["a", "b", "c"], "delay_s": 0.05}
    )
    await coordinator.send(offer_frame("j1"))
    await coordinator.send(offer_frame("j2"))
    done: dict[str, dict[str, Any]] = {}
    texts = {"j1": "", "j2": ""}
    while len(done) < 2:
        frame = await asyncio.wait_for(coordinator.frames.get(), 10)
        if frame["type"] == "token":
            texts[frame["job"]] += frame["text"]
        elif frame["type"] == "done":
            done[frame["job"]] = frame
        else:
            assert frame["type"] == "claim"
    for job in ("j1", "j2"):
        assert texts[job] == "abc"
        assert_receipt(coordinator.hellos[0], job, done[job], "abc")


@pytest.mark.asyncio
async def test_an_offer_for_a_model_not_loaded_gets_an_error(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(coordinator)
    await coordinator.send(offer_frame("j", model="llama-70b"))
    error = await coordinator.expect("error", job="j")
    assert "not loaded" in error["message"]


@pytest.mark.asyncio
async def test_malformed_and_unknown_frames_do_not_crash_the_agent(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(coordinator)
    for junk in ["not json", "[1, 2]", '{"type": 5}', '{"no": "type"}']:
        await coordinator.send(junk)
    await coordinator.send({"type": "bogus", "job": "x"})
    await coordinator.send({"type": "offer"})  # no job id: nothing to answer
    await coordinator.send({"type": "cancel", "job": "unknown"})
    await coordinator.send({"type": "error", "message": "something you did"})
    await coordinator.send(offer_frame("bad-params", params={"max_tokens": "many"}))
    error = await coordinator.expect("error", job="bad-params")
    assert "max_tokens" in error["message"]
    await coordinator.send(offer_frame("no-input", messages=None, prompt=None))
    await coordinator.expect("error", job="no-input")
    await coordinator.send(offer_frame("good"))
    await coordinator.expect("claim", job="good")
    text, _ = await coordinator.stream_collect("good")
    assert text == "The answer is 4."


@pytest.mark.asyncio
async def test_a_failed_model_load_is_reported_and_not_listed(
    coordinator, agent_start
) -> None:
    await agent_start(coordinator, script={"load_error": "CUDA out of memory"})
    heartbeat = await coordinator.heartbeat()
    assert heartbeat["devices"][0]["loaded_models"] == []
    failed = await coordinator.expect("model_load_failed")
    assert failed == {
        "type": "model_load_failed",
        "device": 0,
        "model": MODEL,
        "error": "CUDA out of memory",
    }


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ({"mode": "error_before_first"}, ["claim", "error"]),
        ({"mode": "empty_done"}, ["claim", "done"]),
        ({"mode": "error_at", "n": 2}, ["claim", "token", "token", "error"]),
    ],
)
async def test_scripted_failures_reach_the_coordinator(
    coordinator, agent_start, offer_frame, script, expected
) -> None:
    await agent_start(coordinator, script=script)
    await coordinator.send(offer_frame("j"))
    frames = [await coordinator.expect(kind, job="j") for kind in expected]
    if expected[-1] == "done":
        assert frames[-1]["usage"]["completion_tokens"] == 0
        assert_receipt(coordinator.hellos[0], "j", frames[-1], "")


@pytest.mark.asyncio
async def test_stall_at_goes_silent_but_keeps_heartbeating(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(coordinator, script={"mode": "stall_at", "n": 1})
    await coordinator.send(offer_frame("j"))
    await coordinator.expect("claim", job="j")
    await coordinator.expect("token", job="j")
    while not coordinator.heartbeats.empty():
        coordinator.heartbeats.get_nowait()
    await coordinator.heartbeat()
    await coordinator.heartbeat()
    assert coordinator.frames.empty()


@pytest.mark.asyncio
async def test_never_claim_ignores_offers(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(coordinator, script={"mode": "never_claim"})
    await coordinator.send(offer_frame("j"))
    await coordinator.receive_nothing(0.5)


@pytest.mark.asyncio
async def test_inflated_counts_and_bad_receipts_are_what_the_script_says(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(
        coordinator, script={"text": "Four.", "inflate_tokens": 50, "bad_receipt": True}
    )
    await coordinator.send(offer_frame("j"))
    await coordinator.expect("claim", job="j")
    text, done = await coordinator.stream_collect("j")
    assert done["usage"]["completion_tokens"] == 50
    hello = coordinator.hellos[0]
    assert not receipt_verify(hello["public_key"], done["receipt"], "j", 50, text)


@pytest.mark.asyncio
async def test_it_reconnects_after_the_connection_drops(
    coordinator, agent_start, offer_frame
) -> None:
    """A dropped connection stops the running job; the agent says hello again."""
    await agent_start(coordinator, script={"mode": "claim_then_silent"})
    await coordinator.send(offer_frame("j"))
    await coordinator.expect("claim", job="j")
    await coordinator.ws.close(1012, "restart")
    await asyncio.wait_for(coordinator.disconnected.wait(), 10)
    await asyncio.wait_for(coordinator.connected.wait(), 10)
    assert len(coordinator.hellos) == 2
    assert coordinator.hellos[1]["public_key"] == coordinator.hellos[0]["public_key"]
    await coordinator.send(offer_frame("j2"))  # the slot of the dropped job is free
    await coordinator.expect("claim", job="j2")


@pytest.mark.asyncio
async def test_a_token_refused_after_accept_backs_off(
    agent_start, coordinator_class
) -> None:
    """Close code 4401 before welcome: retries come after growing delays."""
    async with coordinator_class(close_code=4401) as fake:
        await agent_start(fake, wait=False, retry_min_s=0.2, retry_max_s=5)
        times = [await asyncio.wait_for(fake.attempt_times.get(), 10) for _ in range(3)]
        assert times[1] - times[0] >= 0.15  # 0.2 s ± 20 %
        assert times[2] - times[1] >= 0.3  # then 0.4 s ± 20 %


@pytest.mark.asyncio
async def test_an_agent_replaced_by_another_of_its_machine_backs_off(
    agent_start, coordinator_class, caplog
) -> None:
    """Two agents with one machine token replace each other (4409) after every
    welcome: each backs off with a growing delay instead of taking the machine
    back at once (found: ~80 reconnections a second, the coordinator busy)."""
    async with coordinator_class(replace=True) as fake:
        await agent_start(fake, wait=False, retry_min_s=0.2, retry_max_s=5)
        times = [await asyncio.wait_for(fake.attempt_times.get(), 10) for _ in range(3)]
        assert times[1] - times[0] >= 0.15  # 0.2 s ± 20 %
        assert times[2] - times[1] >= 0.3  # then 0.4 s ± 20 %
        assert len(fake.hellos) >= 2  # each time welcomed, then replaced
    assert "another agent connected as this machine" in caplog.text


@pytest.mark.asyncio
async def test_a_token_refused_by_the_handshake_does_not_spin(
    agent_start, coordinator_class, caplog
) -> None:
    """HTTP 403: the agent logs it, stays up and retries with backoff.

    The library's backoff waits 0-5 s (random) after the first refusal, then
    3.1 s: within 1 s of the first attempt, at most one more comes.
    """
    async with coordinator_class(refuse_http=True) as fake:
        await agent_start(fake, wait=False)
        first = await asyncio.wait_for(fake.attempt_times.get(), 10)
        await asyncio.sleep(1.2)  # an observation window for a negative check
        assert len([t for t in fake.attempts if t - first < 1.0]) <= 2
    assert "refused the machine token (HTTP 403)" in caplog.text


@pytest.mark.asyncio
async def test_the_real_llamacpp_engine_serves_an_offer(
    coordinator, agent_start, offer_frame, llama_engine
) -> None:
    await agent_start(coordinator, engine=llama_engine)
    await coordinator.send(offer_frame("real"))
    await coordinator.expect("claim", job="real")
    text, done = await coordinator.stream_collect("real", timeout=60)
    assert "4" in text
    assert 0 < done["usage"]["completion_tokens"] <= len(text)
    assert done["usage"]["prompt_tokens"] > 0
    assert_receipt(coordinator.hellos[0], "real", done, text)


@pytest.mark.asyncio
async def test_it_signs_the_coordinators_challenge_in_its_hello(
    coordinator, agent_start
) -> None:
    from billing.receipts import challenge_verify

    await agent_start(coordinator)
    hello = coordinator.hellos[0]
    assert challenge_verify(
        public_key_b64=hello["public_key"],
        proof_b64=hello["proof"],
        nonce=coordinator.nonces[0],
    )


@pytest.mark.asyncio
async def test_it_answers_a_cancel_with_a_receipt_over_the_text_it_sent(
    coordinator, agent_start, offer_frame
) -> None:
    """``cancelled`` follows the job's last token: usage and a receipt over
    exactly the text of its token frames (docs/protocol-notes.md)."""
    await agent_start(
        coordinator, script={"pieces": [f" w{i}" for i in range(200)], "delay_s": 0.02}
    )
    await coordinator.send(offer_frame("long"))
    await coordinator.expect("claim", job="long")
    sent = [(await coordinator.expect("token", job="long"))["text"]]
    await coordinator.send({"type": "cancel", "job": "long"})
    while True:
        frame = await asyncio.wait_for(coordinator.frames.get(), 10)
        if frame["type"] == "cancelled":
            break
        assert frame["type"] == "token" and frame["job"] == "long"
        sent.append(frame["text"])
    text = "".join(sent)
    tokens = frame["usage"]["completion_tokens"]
    assert 1 <= tokens <= len(text)
    assert receipt_verify(
        coordinator.hellos[0]["public_key"], frame["receipt"], "long", tokens, text
    )
    await coordinator.receive_nothing()
