"""What the agent declares and does beyond text (docs/protocol-notes.md "Output
features"): ``hello.features`` from its engine, offers needing a feature its
engine lacks refused by name (never served as plain text), and ``token``
frames carrying their tokens' log-probabilities when the offer asked."""

from __future__ import annotations

import asyncio

import pytest

from agent.engines.base import GenerationError, GenerationRequest, GenerationResult
from agent.engines.scripted import ScriptedEngine

MODEL = "smollm2-135m-instruct"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "script, declared",
    [
        ({}, []),
        ({"features": ["logprobs", "json_object"]}, ["json_object", "logprobs"]),
    ],
)
async def test_the_hello_declares_what_the_engine_does(
    coordinator, agent_start, script, declared
) -> None:
    await agent_start(coordinator, script=script)
    assert coordinator.hellos[0]["features"] == declared


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "extra, named",
    [
        ({"response_format": {"type": "json_object"}}, "json_object"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "json_schema",
        ),
        ({"logprobs": 2}, "logprobs"),
    ],
)
async def test_an_offer_needing_a_feature_the_engine_lacks_is_refused(
    coordinator, agent_start, offer_frame, extra, named
) -> None:
    await agent_start(coordinator, script={"features": []})
    await coordinator.send(offer_frame("job-1", **extra))
    error = await coordinator.expect("error", job="job-1")
    assert named in error["message"]
    await coordinator.receive_nothing()


@pytest.mark.asyncio
async def test_a_malformed_response_format_is_refused(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(coordinator, script={"features": ["json_schema"]})
    bad = {"type": "json_schema", "json_schema": {"schema": "not an object"}}
    await coordinator.send(offer_frame("job-1", response_format=bad))
    error = await coordinator.expect("error", job="job-1")
    assert "response_format" in error["message"]


@pytest.mark.asyncio
async def test_token_frames_carry_the_logprobs_asked(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(
        coordinator,
        script={"pieces": ["Caf", "é", " \x00ok"], "features": ["logprobs"]},
    )
    await coordinator.send(offer_frame("job-1", logprobs=2))
    await coordinator.expect("claim", job="job-1")
    frames = []
    while True:
        frame = await asyncio.wait_for(coordinator.frames.get(), 10)
        if frame["type"] == "done":
            break
        frames.append(frame)
    assert all(f["type"] == "token" and "logprobs" in f for f in frames)
    text = "".join(f["text"] for f in frames)
    entries = [entry for f in frames for entry in f["logprobs"]]
    assert text == "Café ok", "the NUL is dropped from the text ..."
    assert b"".join(bytes(e["bytes"]) for e in entries) == text.encode(), (
        "... and from its token's bytes"
    )
    assert all(len(e["top_logprobs"]) == 2 for e in entries)


@pytest.mark.asyncio
async def test_token_frames_carry_no_logprobs_unasked(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(coordinator, script={"features": ["logprobs"]})
    await coordinator.send(offer_frame("job-1"))
    await coordinator.expect("claim", job="job-1")
    frame = await coordinator.expect("token", job="job-1")
    assert "logprobs" not in frame


@pytest.mark.asyncio
async def test_the_scripted_engine_refuses_what_it_did_not_declare() -> None:
    engine = ScriptedEngine({"features": ["logprobs"]})
    await engine.load()
    request = GenerationRequest(
        model=MODEL, prompt="hi", response_format={"type": "json_object"}
    )
    with pytest.raises(GenerationError, match="json_object"):
        async for _ in engine.stream(request, GenerationResult()):
            pass
    with pytest.raises(ValueError, match="features"):
        ScriptedEngine({"features": ["telepathy"]})
