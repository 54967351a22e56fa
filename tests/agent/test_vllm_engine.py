"""The vLLM engine against exchanges taken from vLLM's documentation.

vLLM needs a GPU and cannot run here, so its answers are replayed by a
documented-exchange double (``docserver.DocServer``, a real HTTP server on
127.0.0.1) from ``exchanges/vllm.jsonl``: the shapes of vLLM's
OpenAI-compatible server (models, version, chat and completions streamed as
OpenAI's chunks, its error object) and its extra chat parameters
(``continue_final_message``, ``add_generation_prompt``). What is checked is
what the engine sends and how it reads what vLLM answers.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent.engines.base import (
    GenerationError,
    GenerationRequest,
    GenerationResult,
    ModelLoadError,
)
from agent.engines.vllm import VLLMEngine

from .docserver import DocServer, exchanges

pytestmark = []

MODEL = "smollm2-135m-instruct"
SERVED = "HuggingFaceTB/SmolLM2-135M-Instruct"
SEA = [{"role": "user", "content": [{"type": "text", "text": "Describe the sea."}]}]


async def run(engine: VLLMEngine, **kwargs: Any) -> tuple[list[str], GenerationResult]:
    result = GenerationResult()
    request = GenerationRequest(model=MODEL, **kwargs)
    return [piece async for piece in engine.stream(request, result)], result


@pytest.mark.asyncio
async def test_load_takes_the_only_model_vllm_serves() -> None:
    with DocServer(exchanges("vllm", "models", "version")) as vllm:
        engine = VLLMEngine(base_url=vllm.url)
        await engine.load()
        assert engine.loaded_models() == [MODEL]
        assert engine.server_model == SERVED
        assert engine.version == "vllm 0.6.4.post1"
        await engine.close()


@pytest.mark.asyncio
async def test_a_fresh_chat_answer_uses_vllms_template_and_the_reference_sampler():
    with DocServer(exchanges("vllm", "models", "version", "chat_stream")) as vllm:
        engine = VLLMEngine(base_url=vllm.url)
        await engine.load()
        pieces, result = await run(
            engine, messages=SEA, params={"max_tokens": 16, "temperature": 0, "seed": 5}
        )
        assert pieces == ["The", " sea", " is", " vast", "."]
        assert (result.finish_reason, result.prompt_tokens, result.completion_tokens) == (
            "stop",
            31,
            5,
        )
        [body] = vllm.bodies("/v1/chat/completions")
        assert body == {
            "model": SERVED,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 16,
            "temperature": 0.0,
            "top_p": 1.0,
            "seed": 5,
            "top_k": 40,
            "min_p": 0.05,
            "repetition_penalty": 1.0,
            "messages": [{"role": "user", "content": "Describe the sea."}],
        }
        await engine.close()


@pytest.mark.asyncio
async def test_a_continuation_leaves_the_healed_prefix_open_as_the_final_message():
    """Prefix "The s": the last message is the assistant's "The", left open
    (``continue_final_message``, no generation prompt); vLLM says " sea"
    again and only "ea" and what follows reach the renter."""
    played = exchanges("vllm", "models", "version", "chat_continued")
    with DocServer(played) as vllm:
        engine = VLLMEngine(base_url=vllm.url)
        await engine.load()
        pieces, result = await run(
            engine, messages=SEA, continue_from="The s", params={"max_tokens": 4}
        )
        assert "The s" + "".join(pieces) == "The sea is vast."
        assert (result.finish_reason, result.completion_tokens) == ("length", 4)
        [body] = vllm.bodies("/v1/chat/completions")
        assert body["messages"][-1] == {"role": "assistant", "content": "The"}
        assert body["continue_final_message"] is True
        assert body["add_generation_prompt"] is False
        await engine.close()


@pytest.mark.asyncio
async def test_a_raw_prompt_is_a_raw_completion_with_the_prefix_appended() -> None:
    played = exchanges("vllm", "models", "version", "completion_stream")
    with DocServer(played) as vllm:
        engine = VLLMEngine(base_url=vllm.url)
        await engine.load()
        pieces, result = await run(
            engine, prompt="The capital of France is", continue_from=""
        )
        assert pieces == [" Paris", "."]
        assert (result.prompt_tokens, result.completion_tokens) == (6, 2)
        [body] = vllm.bodies("/v1/completions")
        assert body["prompt"] == "The capital of France is"
        assert "messages" not in body and "continue_final_message" not in body
        await engine.close()


@pytest.mark.asyncio
async def test_vllms_error_object_is_a_generation_error() -> None:
    played = exchanges("vllm", "models", "version", "chat_bad_request")
    with DocServer(played) as vllm:
        engine = VLLMEngine(base_url=vllm.url)
        await engine.load()
        with pytest.raises(GenerationError, match="400.*continue_final_message"):
            await run(engine, messages=SEA)
        await engine.close()


@pytest.mark.asyncio
async def test_load_fails_when_vllm_does_not_serve_the_named_model() -> None:
    with DocServer(exchanges("vllm", "models")) as vllm:
        engine = VLLMEngine(base_url=vllm.url, server_model="Qwen/Qwen2.5-7B-Instruct")
        with pytest.raises(ModelLoadError, match="does not serve"):
            await engine.load()
        await engine.close()
    with DocServer([]) as vllm:  # answers 404 to everything
        engine = VLLMEngine(base_url=vllm.url)
        with pytest.raises(ModelLoadError, match="cannot list models"):
            await engine.load()
        await engine.close()
