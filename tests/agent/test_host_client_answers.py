"""The protocol client against a fake coordinator: an answer's frames (claim,
tokens joined or apart, NUL dropped, the socket corked) and its receipt."""

from __future__ import annotations

import contextlib
import socket

import pytest

from .helpers import assert_receipt


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
