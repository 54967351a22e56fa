"""The scripted engine (a test double): pieces, counts and misbehaviours."""

from __future__ import annotations

import pytest

from agent.engines import engine_create
from agent.engines.base import (
    GenerationError,
    GenerationRequest,
    GenerationResult,
    ModelLoadError,
)

pytestmark = []

MODEL = "smollm2-135m-instruct"


async def run(engine, max_tokens: int = 64) -> tuple[list[str], GenerationResult]:
    result = GenerationResult()
    request = GenerationRequest(
        model=MODEL, prompt="hi", params={"max_tokens": max_tokens}
    )
    return [piece async for piece in engine.stream(request, result)], result


@pytest.mark.asyncio
async def test_it_streams_the_text_in_word_pieces() -> None:
    engine = engine_create("scripted", script={"text": "Four, of course."})
    await engine.load()
    pieces, result = await run(engine)
    assert pieces == ["Four,", " of", " course."]
    assert (result.finish_reason, result.completion_tokens) == ("stop", 3)


@pytest.mark.asyncio
async def test_it_stops_at_max_tokens_and_can_inflate_the_count() -> None:
    engine = engine_create(
        "scripted", script={"pieces": ["a", "b", "c"], "inflate_tokens": 99}
    )
    await engine.load()
    pieces, result = await run(engine, max_tokens=2)
    assert pieces == ["a", "b"]
    assert (result.finish_reason, result.completion_tokens) == ("length", 99)


@pytest.mark.asyncio
async def test_error_at_raises_after_n_pieces() -> None:
    engine = engine_create(
        "scripted", script={"pieces": ["a", "b", "c"], "mode": "error_at", "n": 2}
    )
    await engine.load()
    seen = []
    with pytest.raises(GenerationError):
        async for piece in engine.stream(
            GenerationRequest(model=MODEL, prompt="x"), GenerationResult()
        ):
            seen.append(piece)
    assert seen == ["a", "b"]


@pytest.mark.asyncio
async def test_load_error_fails_the_load_and_lists_nothing() -> None:
    engine = engine_create("scripted", script={"load_error": "CUDA out of memory"})
    with pytest.raises(ModelLoadError) as caught:
        await engine.load()
    assert caught.value.model == MODEL and caught.value.error == "CUDA out of memory"
    assert engine.loaded_models() == []


def test_it_refuses_an_unknown_mode() -> None:
    with pytest.raises(ValueError):
        engine_create("scripted", script={"mode": "explode"})
    with pytest.raises(ValueError):
        engine_create("nonesuch")


@pytest.mark.asyncio
async def test_from_prompt_answers_a_pure_function_of_the_prompt_and_continues_it() -> (
    None
):
    """The chaos suite's hosts: any continuation can be checked exactly."""
    from agent.engines.scripted import answer_for

    engine = engine_create("scripted", script={"from_prompt": 5})
    await engine.load()
    messages = [{"role": "user", "content": "chaos-7"}]

    async def answer(continue_from: str = "") -> str:
        request = GenerationRequest(
            model=MODEL, messages=messages, continue_from=continue_from
        )
        return "".join([p async for p in engine.stream(request, GenerationResult())])

    whole = await answer()
    assert whole == answer_for("chaos-7", 5) and len(whole.split()) == 5
    assert whole != answer_for("chaos-8", 5)
    for cut in (1, 9, len(whole) - 1):  # mid-word too
        assert whole[:cut] + await answer(whole[:cut]) == whole
    with pytest.raises(GenerationError, match="not a prefix"):
        await answer("something else")
